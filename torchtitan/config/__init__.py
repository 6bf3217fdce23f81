"""Typed job configuration: defaults < TOML file < command-line overrides.

Every option is a dataclass field with a one-line help text (``opt(default, help)``), which
``--help`` prints. A field with a fixed set of values is typed with one of the ``Literal``
aliases of ``base.py``: that alias is the only list of its values (other modules import it, see
``choices``), and the value is checked as soon as it is read. ``parse_args`` reads
``--job.config_file`` first, then applies the TOML file, then the CLI overrides, then runs
``JobConfig.validate()`` (each section checks itself); every user mistake raises ``ConfigError``
with one line. The package imports no other project module but ``paths``.

    base.py      Literal aliases, choices, suggest, ConfigError, opt, Section
    sections.py  the [section] dataclasses of the job, model, data, checkpoints and logs
    scaling.py   the [section] dataclasses of parallelism, AC, compile, float8, experimental
    fault_tolerance.py  the [fault_tolerance] section (replica groups through torchft)
    job.py       JobConfig: all sections, checks across them, to_toml
    parse.py     TOML + CLI reading, coercion, --help, parse_args
"""

from torchtitan.config.base import (
    ASSETS,
    ACMode,
    AsyncMode,
    AttentionKernel,
    AttentionMaskKind,
    ConfigError,
    DecayType,
    ExcludableState,
    ExportDtype,
    Float8Recipe,
    LogitsLoss,
    MixedPrecisionDtype,
    ModelName,
    NonFinitePolicy,
    OptimizerImplementation,
    OptimizerName,
    PipelineSchedule,
    ReshardAfterForward,
    RotateMethod,
    SaveMatmuls,
    Section,
    choices,
    opt,
    suggest,
)
from torchtitan.config.fault_tolerance import FaultTolerance, ReplicaBackend, SemiSyncMethod
from torchtitan.config.job import JobConfig
from torchtitan.config.parse import help_text, parse_args
from torchtitan.config.scaling import (
    ActivationCheckpoint,
    Compile,
    Experimental,
    Float8,
    Parallelism,
)
from torchtitan.config.sections import (
    MODEL_SHAPE_KEYS,
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

__all__ = [
    "AttentionKernel",
    "AttentionMaskKind",
    "ASSETS",
    "MODEL_SHAPE_KEYS",
    "ACMode",
    "ActivationCheckpoint",
    "AsyncMode",
    "Checkpoint",
    "Comm",
    "Compile",
    "ConfigError",
    "DecayType",
    "ExcludableState",
    "Experimental",
    "ExportDtype",
    "FaultTolerance",
    "Float8",
    "Float8Recipe",
    "LogitsLoss",
    "Job",
    "JobConfig",
    "LRScheduler",
    "Metrics",
    "MixedPrecisionDtype",
    "Model",
    "ModelName",
    "NonFinitePolicy",
    "Optimizer",
    "OptimizerImplementation",
    "OptimizerName",
    "Parallelism",
    "PipelineSchedule",
    "Profiling",
    "ReplicaBackend",
    "ReshardAfterForward",
    "RotateMethod",
    "SaveMatmuls",
    "Section",
    "SemiSyncMethod",
    "Training",
    "Validation",
    "choices",
    "help_text",
    "opt",
    "parse_args",
    "suggest",
]
