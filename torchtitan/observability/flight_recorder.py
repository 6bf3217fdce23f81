"""Flight Recorder: every rank keeps a ring buffer of its last N collectives; dump it on a hang.

PyTorch's c10d records each collective a rank issues (op, process group, sequence number, tensor
shapes and dtypes, Python stack) in a per-process ring buffer, the Flight Recorder. When a job
hangs, the buffers of all ranks, read side by side, say which rank stopped where; see
``torchtitan.observability.hang_report``.

The pieces, in the order a trainer uses them:

* ``configure_env(cfg.comm, dump_folder)`` -- before ``init_process_group``: the buffer size and,
  for NCCL, the watchdog's dump-on-timeout (the recorder reads these variables once, on first use).
* ``set_timeout(init_seconds)`` -- right after building the DeviceMesh: sub-groups get the
  backend's default timeout otherwise, not the one given to ``init_process_group``.
* ``set_train_timeout(seconds)`` -- after the first step: the collective timeout of every process
  group drops from the generous init timeout (compile, warm-up) to the training one, so a hang
  ends (and dumps) after that long instead of hanging for the init timeout.
* ``dump_on_failure(folder)`` -- around the training loop: an exception (a gloo timeout, an NCCL
  error) or a SIGTERM (torchrun tearing the job down because another rank failed) writes this
  rank's buffer to ``folder/rank_<r>`` and re-raises. The trainer passes ``dump_if`` so that only
  communication failures dump (``is_communication_failure``): a user error, a non-finite loss or
  bad data says nothing about the collectives, and a dump would send the user looking there.
* ``dump(folder, reason)`` -- write this rank's buffer now.

gloo vs NCCL (torch 2.11-2.13):

* gloo records every collective (on by default, 2000 entries unless ``TORCH_FR_BUFFER_SIZE``), but
  has no watchdog: nothing is dumped automatically on a timeout, entries' ``state`` is always
  ``scheduled`` (only ``retired`` and ``pg_status`` tell completed from pending), and the dump's
  ``pg_config`` is empty -- ``dump`` rewrites it from the live process groups, which torch's
  ``torchfrtrace`` analyzer needs. A timed-out gloo collective raises ``RuntimeError`` in Python,
  which ``dump_on_failure`` catches.
* NCCL records start/completion (``state`` scheduled/started/completed, timings with
  ``TORCH_NCCL_ENABLE_TIMING=1``) and fills ``pg_config`` itself. Its watchdog thread detects the
  timeout; with ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` it writes ``<TORCH_FR_DUMP_TEMP_FILE><rank>`` on
  every rank (the timed-out one signals the others through the store) -- the dumps come from the
  watchdog, into the same folder. The timed-out rank then sleeps 4x
  ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC`` (``comm.dump_wait_seconds``) so that the other ranks
  have time to dump, and aborts its communicators and the process. Python may see a
  ``DistBackendError`` ("NCCL communicator was aborted") in between, or nothing at all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

logger = logging.getLogger("torchtitan")

DUMP_PREFIX = "rank_"
# The first name of each pair is the one torch reads first (2.11-2.13); the second an older alias
# that torch 2.13 warns about when it is set.
BUFFER_SIZE_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def trace_folder(cfg_comm, dump_folder: str | os.PathLike) -> Path:
    """Where this job's Flight Recorder dumps go: ``dump_folder/comm.flight_recorder_folder``."""
    return Path(dump_folder) / cfg_comm.flight_recorder_folder


def configure_env(cfg_comm, dump_folder: str | os.PathLike, environ=None) -> dict[str, str]:
    """Set the Flight Recorder's environment variables; call BEFORE ``init_process_group``.

    ``cfg_comm`` is the ``[comm]`` config section (``trace_buf_size``, ``flight_recorder_folder``).
    Sets ``TORCH_FR_BUFFER_SIZE`` and, unless that is 0, ``TORCH_FR_DUMP_TEMP_FILE`` (where the
    NCCL watchdog dumps: ``<folder>/rank_``), ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``,
    ``TORCH_NCCL_ENABLE_MONITORING=1`` and ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC`` (from
    ``dump_wait_seconds``). A
    variable the user set (or its older ``TORCH_NCCL_*`` alias) is left alone. Creates the dump
    folder. Returns the variables this call set.
    """
    env = os.environ if environ is None else environ
    if dist.is_available() and dist.is_initialized():
        logger.warning(
            "flight recorder: configure_env() after init_process_group; the buffer size "
            "and dump settings may already be fixed"
        )
    wanted: dict[str, str] = {}
    size = _first_set(env, BUFFER_SIZE_VARS, None)
    if size is None:
        size = wanted[BUFFER_SIZE_VARS[0]] = str(cfg_comm.trace_buf_size)
    if _int(size) > 0:
        prefix = _first_set(env, DUMP_FILE_VARS, None)
        if prefix is None:
            prefix = str(trace_folder(cfg_comm, dump_folder) / DUMP_PREFIX)
            wanted[DUMP_FILE_VARS[0]] = prefix
        # NCCL only (gloo has no watchdog): the watchdog dumps every rank's buffer on a timeout.
        # DUMP_ON_TIMEOUT needs the monitoring thread and a non-zero buffer.
        wanted["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
        wanted["TORCH_NCCL_ENABLE_MONITORING"] = "1"
        # How long the watchdog waits for a dump. After signalling the other ranks to dump, the
        # timed-out rank also sleeps 4x this before it aborts (torch 2.11: 15 s -> 60 s, measured
        # on 2xH200), so a hung job ends no sooner than train_timeout + 4 * dump_wait_seconds.
        wanted["TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"] = str(1000 * cfg_comm.dump_wait_seconds)
        Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    added = {k: v for k, v in wanted.items() if k not in env}
    env.update(added)
    return added


def _first_set(env, names: tuple[str, ...], default):
    return next((env[n] for n in names if env.get(n)), default)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


# --------------------------------------------------------------------------- timeouts


def set_timeout(seconds: float, groups=None) -> int:
    """Set the collective timeout of ``groups`` (default: every process group of this rank).

    "Every group" is the default group plus all groups created since, DeviceMesh sub-groups and
    flattened meshes included. Applies to collectives issued from now on. Returns how many groups
    were changed.

    Sub-groups do NOT inherit ``init_process_group``'s timeout: ``new_group`` (and so DeviceMesh)
    gives them the backend's default (30 min gloo, 10 min NCCL). Call this with the init timeout
    right after building the mesh, and ``set_train_timeout`` after the first step.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    c10d = dist.distributed_c10d
    timeout = timedelta(seconds=seconds)
    if groups is None:
        groups = list(c10d._world.pg_map)
    changed = 0
    for group in groups:
        if c10d._rank_not_in_group(group):
            continue
        with warnings.catch_warnings():  # e.g. the fake backend: "only supported for nccl/gloo"
            warnings.simplefilter("ignore")
            c10d._set_pg_timeout(timeout, group)
        changed += 1
    return changed


def set_train_timeout(seconds: float, groups=None) -> int:
    """``set_timeout`` after the first step: from now on a hung collective fails after
    ``seconds`` (``comm.train_timeout_seconds``) instead of the init timeout."""
    return set_timeout(seconds, groups)


# --------------------------------------------------------------------------- dumping


def _rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _backend() -> str:
    if dist.is_available() and dist.is_initialized():
        return str(dist.get_backend())
    return ""


def _read_trace() -> dict | None:
    """This process's buffers as torch pickles them, merged into one dict.

    NCCL collectives go to a recorder of their own (``_dump_nccl_trace``); gloo and the other
    backends share the generic one (``_dump_fr_trace``). A job with both (``cpu:gloo,cuda:nccl``)
    gets the entries of both.
    """
    c = torch._C._distributed_c10d
    backend = _backend()
    raws = []
    if "nccl" in backend and hasattr(c, "_dump_nccl_trace"):
        raws.append(c._dump_nccl_trace())
    if ("nccl" not in backend or "gloo" in backend) and hasattr(c, "_dump_fr_trace"):
        raws.append(c._dump_fr_trace())
    if not raws:
        return None
    trace, *others = [pickle.loads(raw) for raw in raws]
    for other in others:
        trace.setdefault("entries", []).extend(other.get("entries") or [])
        for key in ("pg_config", "pg_status"):
            trace.setdefault(key, {}).update(other.get(key) or {})
    return trace


def process_groups() -> dict[str, dict[str, str]]:
    """``{group name: {"name", "desc", "ranks": "[0, 1]"}}`` of this rank's live process groups.

    This is the ``pg_config`` that torch's analyzer expects; gloo leaves it empty.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return {}
    c10d = dist.distributed_c10d
    config = {}
    for group in list(c10d._world.pg_map):
        name = c10d._get_process_group_name(group)
        config[name] = {
            "name": name,
            "desc": getattr(group, "group_desc", "") or "",
            "ranks": str(dist.get_process_group_ranks(group)),
        }
    return config


def dump(folder: str | os.PathLike, reason: str = "", rank: int | None = None) -> Path | None:
    """Write this rank's Flight Recorder buffer to ``folder/rank_<rank>``; returns the path.

    The file is torch's pickle with ``pg_config`` filled in from the live process groups (so
    ``torchfrtrace folder -p rank_`` works on gloo too) and a ``torchtitan`` entry with the rank,
    world size, reason and time. Written to a temporary name first, then renamed. Returns None if
    this torch build has no Flight Recorder.
    """
    trace = _read_trace()
    if trace is None:
        return None
    rank = _rank() if rank is None else rank
    config = {k: v for k, v in (trace.get("pg_config") or {}).items() if k}
    config.update(process_groups())
    trace["pg_config"] = config
    trace["torchtitan"] = {
        "rank": rank,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "reason": reason,
        "time": time.time(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "backend": _backend(),
        "buffer_size": _int(_first_set(os.environ, BUFFER_SIZE_VARS, "2000")),
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{DUMP_PREFIX}{rank}"
    # The temporary name must not contain the prefix: torchfrtrace parses every such file.
    tmp = folder / f".partial-{rank}-{os.getpid()}"
    tmp.write_bytes(pickle.dumps(trace))
    os.replace(tmp, path)
    return path


class Terminated(SystemExit):
    """Raised in the main thread by ``dump_on_failure``'s SIGTERM handler."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"received {signal.Signals(self.signum).name}"


# Words of the RuntimeErrors that gloo (and older NCCL builds) raise for a timeout or a lost peer,
# e.g. "[.../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation"
# and "[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:59079".
_COMMUNICATION_WORDS = ("gloo", "nccl", "connection closed by peer", "connection reset by peer")


def is_communication_failure(error: BaseException) -> bool:
    """Whether ``error`` comes from the collectives: a timeout, an NCCL or gloo error, a lost peer
    or store (``torch.distributed.DistError``), or torchrun's SIGTERM after another rank failed
    (``Terminated``). Only these make a Flight Recorder dump worth reading."""
    if isinstance(error, Terminated):
        return True
    if dist.is_available() and isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(w in text for w in _COMMUNICATION_WORDS)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


@contextlib.contextmanager
def dump_on_failure(
    folder: str | os.PathLike,
    enabled: bool = True,
    rank: int | None = None,
    handle_sigterm: bool = True,
    dump_if: Callable[[BaseException], bool] | None = None,
):
    """Dump this rank's buffer (``dump``) if the block raises, then re-raise.

    Catches everything but a clean ``SystemExit`` (code 0/None): a collective timeout
    (``RuntimeError`` / ``DistBackendError``), an NCCL error, Ctrl-C; with ``dump_if``, only the
    exceptions it accepts (e.g. ``is_communication_failure``). With ``handle_sigterm``
    (main thread only), SIGTERM raises ``Terminated`` (exit code 143) in the block, so a rank that
    torchrun stops because another rank failed dumps too. A rank blocked inside a gloo collective
    sees the signal when that collective returns (at the latest after its timeout; torchrun waits
    30 s before SIGKILL). A second SIGTERM during the dump is ignored.
    """
    state = {"dumping": False}

    def on_sigterm(signum, frame):
        if not state["dumping"]:
            raise Terminated(signum)

    previous = None
    if handle_sigterm and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except BaseException as e:
        clean_exit = isinstance(e, SystemExit) and not isinstance(e, Terminated) and not e.code
        wanted = dump_if is None or dump_if(e)
        if enabled and wanted and not clean_exit and not isinstance(e, GeneratorExit):
            state["dumping"] = True
            try:
                path = dump(folder, _first_line(e), rank)
                if path is not None:
                    logger.error("flight recorder: wrote %s (%s)", path, _first_line(e))
            except Exception as dump_error:  # never hide the original failure
                logger.error("flight recorder: dump failed: %s", _first_line(dump_error))
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
