"""Test-only fault injection, inert unless ``TORCHTITAN_FAULT`` is set.

    TORCHTITAN_FAULT="skip_collective:rank=1:step=3"
    TORCHTITAN_FAULT="delay:rank=1:step=3:seconds=30"
    TORCHTITAN_FAULT="nan_loss:step=4;crash:rank=1:step=5"      (several, separated by ';')

A fault is ``kind`` followed by ``:key=value`` fields. ``step`` is required, ``rank`` is optional
(no rank: every rank), and so is ``attempt``: the torchrun restart it fires in
(``TORCHELASTIC_RESTART_COUNT``; no attempt: every attempt, so a restarted job meets it again).
Kinds and what ``maybe_inject(kind, step, rank)`` does when one matches:

=================  ==============================================================================
skip_collective    returns True: the caller skips the collective it guards
nan_loss           returns True: the caller makes the loss NaN
delay              sleeps ``seconds`` (required), then returns True
crash              raises ``InjectedFault`` (a RuntimeError: the Python error path runs)
kill               SIGKILLs its own process (no exception, no cleanup, no dump)
=================  ==============================================================================

The trainer calls them through ``FaultInjector``: crash, kill and delay at the start of a step,
nan_loss on each micro-step's loss (not under pipeline parallelism), skip_collective on the
data-parallel loss all-reduce.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from dataclasses import dataclass

logger = logging.getLogger("torchtitan")

ENV = "TORCHTITAN_FAULT"
# kind -> (required fields, optional fields)
KINDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "skip_collective": (frozenset({"step"}), frozenset({"rank", "attempt"})),
    "nan_loss": (frozenset({"step"}), frozenset({"rank", "attempt"})),
    "delay": (frozenset({"step", "seconds"}), frozenset({"rank", "attempt"})),
    "crash": (frozenset({"step"}), frozenset({"rank", "attempt"})),
    "kill": (frozenset({"step"}), frozenset({"rank", "attempt"})),
}


class InjectedFault(RuntimeError):
    """The error a ``crash`` fault raises."""


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None
    seconds: float = 0.0
    attempt: int | None = None

    def matches(self, kind: str, step: int, rank: int) -> bool:
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        return (
            self.kind == kind
            and self.step == step
            and self.rank in (None, rank)
            and self.attempt in (None, attempt)
        )


@functools.lru_cache(maxsize=8)
def parse(spec: str) -> tuple[Fault, ...]:
    """Parse a ``TORCHTITAN_FAULT`` value; a mistake raises a one-line ValueError."""
    faults = []
    for part in (p.strip() for p in spec.split(";")):
        if part:
            faults.append(_parse_one(part))
    return tuple(faults)


def _parse_one(text: str) -> Fault:
    kind, *fields = [f.strip() for f in text.split(":")]
    if kind not in KINDS:
        raise ValueError(f"{ENV}: unknown fault {kind!r} in {text!r}; kinds: {', '.join(KINDS)}")
    required, optional = KINDS[kind]
    values: dict[str, str] = {}
    for f in fields:
        key, eq, value = f.partition("=")
        if not eq or not value:
            raise ValueError(f"{ENV}: expected key=value, got {f!r} in {text!r}")
        if key not in required | optional:
            allowed = ", ".join(sorted(required | optional))
            raise ValueError(f"{ENV}: {kind} takes {allowed}; got {key!r} in {text!r}")
        values[key] = value
    if missing := sorted(required - set(values)):
        raise ValueError(f"{ENV}: {kind} needs {', '.join(missing)} in {text!r}")
    step = _number(values["step"], int, "step", text)
    rank = _number(values["rank"], int, "rank", text) if "rank" in values else None
    seconds = _number(values.get("seconds", "0"), float, "seconds", text)
    attempt = _number(values["attempt"], int, "attempt", text) if "attempt" in values else None
    if step < 0 or (rank is not None and rank < 0) or seconds < 0 or (attempt or 0) < 0:
        raise ValueError(f"{ENV}: step, rank, attempt and seconds must be >= 0 in {text!r}")
    return Fault(kind, step, rank, seconds, attempt)


def _number(value: str, tp, key: str, text: str):
    try:
        return tp(value)
    except ValueError:
        raise ValueError(f"{ENV}: {key} must be a number, got {value!r} in {text!r}") from None


def faults_from_env(environ=None) -> tuple[Fault, ...]:
    return parse((os.environ if environ is None else environ).get(ENV, ""))


def maybe_inject(kind: str, step: int, rank: int, faults: tuple[Fault, ...] | None = None) -> bool:
    """Inject the fault of ``kind`` configured for (``step``, ``rank``); True if one fired.

    Free when ``TORCHTITAN_FAULT`` is unset. ``faults`` overrides the environment (tests).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; kinds: {', '.join(KINDS)}")
    if faults is None:
        spec = os.environ.get(ENV)
        if not spec:
            return False
        faults = parse(spec)
    fault = next((f for f in faults if f.matches(kind, step, rank)), None)
    if fault is None:
        return False
    logger.warning("fault injection: %s at step %d on rank %d", kind, step, rank)
    if kind == "delay":
        time.sleep(fault.seconds)
    elif kind == "crash":
        raise InjectedFault(f"injected crash at step {step} on rank {rank}")
    elif kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    return True


class FaultInjector:
    """The trainer's injection points for one rank, with the faults read once from the
    environment (``faults`` overrides them); every point is a no-op when there are none."""

    def __init__(self, rank: int, faults: tuple[Fault, ...] | None = None):
        self.rank = rank
        self.faults = faults_from_env() if faults is None else faults

    def at_step_start(self, step: int) -> None:
        """Start of a step: the ``crash``, ``kill`` or ``delay`` set for it, in that order."""
        for kind in ("crash", "kill", "delay"):
            self._fire(kind, step)

    def poison_loss(self, step: int, loss):
        """The loss, made NaN where a ``nan_loss`` is set for this step."""
        return loss * float("nan") if self._fire("nan_loss", step) else loss

    def skip_collective(self, step: int) -> bool:
        """True where a ``skip_collective`` is set for this step: skip the collective."""
        return self._fire("skip_collective", step)

    def _fire(self, kind: str, step: int) -> bool:
        return bool(self.faults) and maybe_inject(kind, step, self.rank, self.faults)
