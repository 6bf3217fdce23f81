"""How a trainer process ends: an exit code, and one line that says why.

| code | why |
|---|---|
| 0 | done |
| 1 | an unexpected error (a bug): Python's traceback is in the rank's log |
| 2 | a mistake in the job: config, data, tokenizer, checkpoint |
| 3 | a non-finite loss or gradient norm (``training.on_nonfinite = "stop"``) |
| 4 | a communication failure: collective timeout, NCCL or gloo error, a lost peer |
| 129 | the launcher (torchrun) is gone: the rank stopped at once, no checkpoint started |
| 130, 143 | stopped by Ctrl-C or SIGTERM (saved first if checkpointing is on) |

The line is logged, and under torchrun also written to the rank's ``TORCHELASTIC_ERROR_FILE``,
torchrun's channel for a worker's failure (``{"message": ..., "timestamp": ...}``, plus a
``torchtitan`` entry). ``torchtitan.launch`` reads these files back and prints, last, the line of
the rank that explains the failure.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from torchtitan import runtime
from torchtitan.launch import KINDS
from torchtitan.observability.flight_recorder import is_communication_failure
from torchtitan.observability.numerics import NonFiniteError
from torchtitan.paths import absolute
from torchtitan.preflight import USER_ERRORS

logger = logging.getLogger("torchtitan")

BUG, USER_ERROR, NONFINITE, COMMUNICATION = 1, 2, 3, 4


@dataclass(frozen=True)
class Ending:
    code: int
    line: str
    kind: str  # one of KINDS


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _communication(error: BaseException, traces: Path | None) -> Ending:
    hint = ""
    if traces is not None and traces.is_dir() and any(traces.iterdir()):
        report = f"python -m torchtitan.observability.hang_report {absolute(traces)}"
        hint = f"; which rank stopped where: {report}"
    return Ending(
        COMMUNICATION, f"error: communication failed: {_first_line(error)}{hint}", KINDS[1]
    )


def classify(error: BaseException, step: int | None, traces: Path | None = None) -> Ending | None:
    """The ending ``error`` means at ``step`` (None: before training); None for a ``SystemExit``
    other than ``Preempted`` (``--help``). ``traces`` is the Flight Recorder folder, named in the
    line of a communication failure."""
    if isinstance(error, runtime.Preempted):
        return Ending(error.code, error.message, KINDS[1] if error.step < 0 else KINDS[2])
    if isinstance(error, KeyboardInterrupt):
        line = f"Ctrl-C: stopped at once during step {step}; not saved"
        return Ending(130, line if step else "Ctrl-C: stopped before training started", KINDS[2])
    if isinstance(error, SystemExit):
        return None
    if isinstance(error, USER_ERRORS):
        return Ending(USER_ERROR, f"error: {error}", KINDS[0])
    if isinstance(error, NonFiniteError):
        return Ending(NONFINITE, f"error: {error}", KINDS[0])
    if is_communication_failure(error):
        return _communication(error, traces)
    return Ending(
        BUG, f"error: {_first_line(error)} (unexpected; the traceback is in the log)", KINDS[0]
    )


def finish(error: BaseException, step: int | None, traces: Path | None = None) -> int | None:
    """Log ``error``'s line and write it to the rank's error file; -> the exit code, or None
    where the caller should re-raise: a bug (Python then prints the traceback), ``--help``."""
    ending = classify(error, step, traces)
    if ending is None:
        return None
    # The trainer logged the line of a stop it saved for; Python ends a bug with its traceback.
    logged = isinstance(error, runtime.Preempted) and error.step >= 0
    if not logged and ending.code != BUG:
        (logger.warning if ending.kind == KINDS[2] else logger.error)(ending.line)
    write_error_file(ending)
    return None if ending.code == BUG else ending.code


def write_error_file(ending: Ending, environ=os.environ) -> Path | None:
    """``ending`` in torchrun's error-file format, where torchrun asks for it; -> the path."""
    name = environ.get("TORCHELASTIC_ERROR_FILE")
    if not name:
        return None
    now = time.time()
    details = {**asdict(ending), "rank": int(environ.get("RANK", "0")), "time": now}
    data = {"message": ending.line, "timestamp": int(now), "torchtitan": details}
    try:
        Path(name).write_text(json.dumps(data))
    except OSError as e:  # never hide the ending itself
        logger.warning("could not write %s: %s", name, e)
        return None
    return Path(name)
