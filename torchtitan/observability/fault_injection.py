"""Test-only fault injection, inert unless ``TORCHTITAN_FAULT`` is set.

    TORCHTITAN_FAULT="skip_collective:rank=1:step=3"
    TORCHTITAN_FAULT="delay:rank=1:step=3:seconds=30"
    TORCHTITAN_FAULT="nan_loss:step=4;crash:rank=1:step=5"      (several, separated by ';')
    TORCHTITAN_FAULT="term:rank=0:step=6:at=save"                 (during step 6's checkpoint write)

A fault is ``kind`` followed by ``:key=value`` fields. ``step`` is required, ``rank`` is optional
(no rank: every rank), and so is ``attempt``: the torchrun restart it fires in
(``TORCHELASTIC_RESTART_COUNT``; no attempt: every attempt, so a restarted job meets it again).
``at`` (crash, kill, term, delay) is where in the step it fires: ``step`` (the default: at its
start), ``save`` (this rank starts writing the step's checkpoint: in the training thread for a
synchronous save, in the background one for an asynchronous save) or ``saved`` (this rank's
write is complete, ``.metadata`` included, and the ``step-N.tmp`` folder is not yet renamed);
with fault tolerance on, also ``join`` (before the trainer joins the replica groups; ``step`` is
the step it starts from, 0 from a seed) or ``commit`` (after the step's exchange across replica
groups, before its commit vote).
Kinds and what ``maybe_inject(kind, step, rank)`` does when one matches:

=================  ==============================================================================
skip_collective    returns True: the caller skips the collective it guards
nan_loss           returns True: the caller makes the loss NaN
delay              sleeps ``seconds`` (required), then returns True
crash              raises ``InjectedFault`` (a RuntimeError: the Python error path runs)
kill               SIGKILLs its own process (no exception, no cleanup, no dump)
term               sends its own process SIGTERM (what a scheduler or torchrun sends), returns True
=================  ==============================================================================

The trainer calls them through ``FaultInjector``: crash, kill, term and delay at the start of a
step, nan_loss on each micro-step's loss (not under pipeline parallelism), skip_collective on the
data-parallel loss all-reduce. The ``save`` and ``saved`` points wrap ``dcp.save`` and
``dcp.async_save`` (only when such a fault is set): the checkpoint's storage writer reports when
it starts writing, the finished save when it is complete.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import time
from dataclasses import dataclass

logger = logging.getLogger("torchtitan")

ENV = "TORCHTITAN_FAULT"
POINTS = ("step", "save", "saved", "join", "commit")  # where a fault with ``at`` fires
_PLACED = frozenset({"rank", "attempt", "at"})
# kind -> (required fields, optional fields)
KINDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "skip_collective": (frozenset({"step"}), frozenset({"rank", "attempt"})),
    "nan_loss": (frozenset({"step"}), frozenset({"rank", "attempt"})),
    "delay": (frozenset({"step", "seconds"}), _PLACED),
    "crash": (frozenset({"step"}), _PLACED),
    "kill": (frozenset({"step"}), _PLACED),
    "term": (frozenset({"step"}), _PLACED),
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
    at: str = "step"

    def matches(self, kind: str, step: int, rank: int, at: str = "step") -> bool:
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        return (
            self.kind == kind
            and self.step == step
            and self.rank in (None, rank)
            and self.attempt in (None, attempt)
            and self.at == at
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
    at = values.get("at", "step")
    if at not in POINTS:
        raise ValueError(f"{ENV}: at must be one of {', '.join(POINTS)}; got {at!r} in {text!r}")
    return Fault(kind, step, rank, seconds, attempt, at)


def _number(value: str, tp, key: str, text: str):
    try:
        return tp(value)
    except ValueError:
        raise ValueError(f"{ENV}: {key} must be a number, got {value!r} in {text!r}") from None


def faults_from_env(environ=None) -> tuple[Fault, ...]:
    return parse((os.environ if environ is None else environ).get(ENV, ""))


def maybe_inject(
    kind: str, step: int, rank: int, faults: tuple[Fault, ...] | None = None, at: str = "step"
) -> bool:
    """Inject the fault of ``kind`` configured for (``step``, ``rank``, point ``at``); True if
    one fired.

    Free when ``TORCHTITAN_FAULT`` is unset. ``faults`` overrides the environment (tests).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; kinds: {', '.join(KINDS)}")
    if faults is None:
        spec = os.environ.get(ENV)
        if not spec:
            return False
        faults = parse(spec)
    fault = next((f for f in faults if f.matches(kind, step, rank, at)), None)
    if fault is None:
        return False
    where = "" if at == "step" else f" ({at})"
    logger.warning("fault injection: %s at step %d%s on rank %d", kind, step, where, rank)
    if kind == "delay":
        time.sleep(fault.seconds)
    elif kind == "crash":
        raise InjectedFault(f"injected crash at step {step} on rank {rank}")
    elif kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    return True


class FaultInjector:
    """The trainer's injection points for one rank, with the faults read once from the
    environment (``faults`` overrides them); every point is a no-op when there are none."""

    def __init__(self, rank: int, faults: tuple[Fault, ...] | None = None):
        self.rank = rank
        self.faults = faults_from_env() if faults is None else faults
        if any(f.at != "step" for f in self.faults):
            _hook_checkpoint_writes(self)

    def at_step_start(self, step: int) -> None:
        """Start of a step: the ``crash``, ``kill``, ``term`` or ``delay`` set for it."""
        self.at_point("step", step)

    def at_point(self, at: str, step: int) -> None:
        """The ``crash``, ``kill``, ``term`` or ``delay`` set for ``step`` at point ``at``."""
        for kind in ("crash", "kill", "term", "delay"):
            if self.faults:
                maybe_inject(kind, step, self.rank, self.faults, at)

    def poison_loss(self, step: int, loss):
        """The loss, made NaN where a ``nan_loss`` is set for this step."""
        return loss * float("nan") if self._fire("nan_loss", step) else loss

    def skip_collective(self, step: int) -> bool:
        """True where a ``skip_collective`` is set for this step: skip the collective."""
        return self._fire("skip_collective", step)

    def _fire(self, kind: str, step: int) -> bool:
        return bool(self.faults) and maybe_inject(kind, step, self.rank, self.faults)


def _step_of(checkpoint_id) -> int:
    match = re.search(r"step-(\d+)", str(checkpoint_id))
    return int(match.group(1)) if match else -1


def _hook_checkpoint_writes(injector: FaultInjector) -> None:
    """Wrap ``dcp.save`` and ``dcp.async_save`` (as the checkpoint manager calls them) so that
    the faults set ``at=save`` fire when this rank starts writing, those ``at=saved`` when the
    save is complete and not yet renamed into place."""
    import torch.distributed.checkpoint as dcp

    class Writer(dcp.FileSystemWriter):
        def write_data(self, plan, planner):
            injector.at_point("save", _step_of(self.path))
            return super().write_data(plan, planner)

    save, async_save = dcp.save, dcp.async_save

    def hooked_save(state_dict, *, checkpoint_id=None, storage_writer=None, **kwargs):
        writer = storage_writer or Writer(checkpoint_id)
        result = save(state_dict, checkpoint_id=checkpoint_id, storage_writer=writer, **kwargs)
        injector.at_point("saved", _step_of(checkpoint_id))
        return result

    def hooked_async_save(state_dict, *, checkpoint_id=None, storage_writer=None, **kwargs):
        writer = storage_writer or Writer(checkpoint_id)
        result = async_save(
            state_dict, checkpoint_id=checkpoint_id, storage_writer=writer, **kwargs
        )
        step = _step_of(checkpoint_id)
        upload = getattr(result, "upload_completion", result)
        upload.add_done_callback(lambda _: injector.at_point("saved", step))
        return result

    dcp.save, dcp.async_save = hooked_save, hooked_async_save
