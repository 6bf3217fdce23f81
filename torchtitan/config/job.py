"""``JobConfig``: every section, and the TOML it saves."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field

from torchtitan.config.base import _toml_value
from torchtitan.config.fault_tolerance import FaultTolerance
from torchtitan.config.scaling import (
    ActivationCheckpoint,
    Compile,
    Experimental,
    Float8,
    Parallelism,
)
from torchtitan.config.sections import (
    Checkpoint,
    Comm,
    Job,
    LRScheduler,
    Metrics,
    Model,
    Optimizer,
    Profiling,
    Training,
    Validation,
)


@dataclass
class JobConfig:
    job: Job = field(default_factory=Job)
    model: Model = field(default_factory=Model)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    training: Training = field(default_factory=Training)
    validation: Validation = field(default_factory=Validation)
    parallelism: Parallelism = field(default_factory=Parallelism)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    activation_checkpoint: ActivationCheckpoint = field(default_factory=ActivationCheckpoint)
    compile: Compile = field(default_factory=Compile)
    float8: Float8 = field(default_factory=Float8)
    experimental: Experimental = field(default_factory=Experimental)
    metrics: Metrics = field(default_factory=Metrics)
    profiling: Profiling = field(default_factory=Profiling)
    comm: Comm = field(default_factory=Comm)
    fault_tolerance: FaultTolerance = field(default_factory=FaultTolerance)

    def validate(self) -> None:
        """Checks that need nothing but the config itself (no files, no devices): each
        section's. Checks across sections and against the world size: ``preflight.check_job``."""
        for section in dataclasses.fields(self):
            getattr(self, section.name).validate()

    def to_toml(self) -> str:
        lines = []
        for section in dataclasses.fields(self):
            lines.append(f"[{section.name}]")
            for f in dataclasses.fields(getattr(self, section.name)):
                lines.append(
                    f"{f.name} = {_toml_value(getattr(getattr(self, section.name), f.name))}"
                )
            lines.append("")
        return "\n".join(lines)


def sections() -> dict[str, type]:
    """Section name -> its dataclass, in the order of ``JobConfig``."""
    hints = typing.get_type_hints(JobConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(JobConfig)}
