"""The building blocks of the config: the ``Literal`` aliases (each the only list of its allowed
values; other modules import them, see ``choices``), the one "did you mean", ``ConfigError``,
``opt`` and the ``Section`` base class that checks its ``Literal`` fields."""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Iterable
from dataclasses import field
from pathlib import Path
from typing import Literal

ASSETS = Path(__file__).resolve().parents[1] / "assets"

# --------------------------------------------------------------------------- allowed values

ModelName = Literal["llama3", "qwen3", "deepseek_v3"]
OptimizerName = Literal["AdamW", "Adam"]
OptimizerImplementation = Literal["auto", "fused", "foreach", "for-loop"]
DecayType = Literal["linear", "cosine", "none"]
MixedPrecisionDtype = Literal["bfloat16", "float32"]
NonFinitePolicy = Literal["stop", "skip"]
RotateMethod = Literal["allgather", "alltoall"]
AttentionKernel = Literal["sdpa", "flex", "varlen"]
AttentionMaskKind = Literal["causal", "document"]
PipelineSchedule = Literal[
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
    "CSV",
]
ReshardAfterForward = Literal["default", "always", "never"]
LogitsLoss = Literal["auto", "in_place", "standard"]
AsyncMode = Literal["disabled", "async", "async_with_pinned_mem"]
ExcludableState = Literal["optimizer", "lr_scheduler", "dataloader", "train_state"]
ExportDtype = Literal["float32", "bfloat16", "float16"]
ACMode = Literal["none", "full", "selective"]
SaveMatmuls = Literal["all", "alternate"]
Float8Recipe = Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"]


def choices(alias) -> tuple[str, ...]:
    """The allowed values of a ``Literal`` alias, in declaration order."""
    if typing.get_origin(alias) is not Literal:
        raise TypeError(f"choices() expects a Literal alias; got {alias!r}")
    return typing.get_args(alias)


def suggest(name: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the candidate closest to ``name`` (ignoring case), or ``""``.

    The "did you mean" of config keys and values, model flavors and fields. (The scripts' own
    ``--flags`` get theirs in ``parse.take_flags``, worded as the flag: "did you mean --x?".)
    """
    by_folded = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(str(name).lower(), list(by_folded), n=1, cutoff=0.5)
    return f"; did you mean '{by_folded[close[0]]}'?" if close else ""


class ConfigError(ValueError):
    """A user mistake in the configuration; the message is one actionable line."""


def opt(default, help: str):
    """A config field with its one-line help text."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _not_one_of(key: str, value, allowed: tuple[str, ...]) -> ConfigError:
    return ConfigError(
        f"--{key} must be one of {', '.join(allowed)}; got {value!r}{suggest(str(value), allowed)}"
    )


def _literal_values(tp) -> tuple[str, ...] | None:
    """The allowed values of a ``Literal`` or ``list[Literal]`` field type, else None."""
    if typing.get_origin(tp) is list:
        (tp,) = typing.get_args(tp)
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None


def section_key(section_cls: type) -> str:
    """The TOML/CLI name of a section class: ``LRScheduler`` -> ``lr_scheduler`` (JobConfig's
    fields are named so; a test holds them to it)."""
    return re.sub(
        r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", section_cls.__name__
    ).lower()


class Section:
    """Base of the config sections: ``validate()`` checks every ``Literal`` field's value (also
    one set in Python, which no parser saw); sections with more checks extend it."""

    def validate(self) -> None:
        section = section_key(type(self))
        for name, tp in typing.get_type_hints(type(self)).items():
            allowed = _literal_values(tp)
            if allowed is None:
                continue
            value = getattr(self, name)
            for item in value if isinstance(value, list) else [value]:
                if item not in allowed:
                    raise _not_one_of(f"{section}.{name}", item, allowed)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if value is None:
        return '""'
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
