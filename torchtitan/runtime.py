"""Process lifecycle: logging, device, process group and mesh, seeding, SIGTERM and Ctrl-C,
restarts."""

from __future__ import annotations

import atexit
import dataclasses
import gc
import logging
import os
import signal
import threading
from datetime import datetime, timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from torchtitan import run_lock
from torchtitan.config import ConfigError, JobConfig
from torchtitan.config.base import _toml_value
from torchtitan.launch import STOP_SIGNAL_NAMES, child_pids, stop_signal_name
from torchtitan.observability import flight_recorder
from torchtitan.parallel.compile import use_per_rank_compile_cache
from torchtitan.parallel.dims import ParallelDims
from torchtitan.preflight import CheckedJob, check_job

logger = logging.getLogger("torchtitan")


def setup_logging(rank: int) -> None:
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def new_run_id() -> str:
    """Unique per launch, sorting in launch order: a quick restart, or a second trainer in the
    same process within the same second, must not append to the previous launch's files."""
    return f"{datetime.now():%Y%m%d-%H%M%S-%f}-{os.getpid()}"


def init_process(cfg: JobConfig, dims: ParallelDims, device: torch.device, rank: int) -> None:
    """Set the device, join the process group (under torchrun) and build the mesh, seed, and
    take over garbage collection (the trainer collects every ``training.gc_freq`` steps)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        flight_recorder.configure_env(cfg.comm, cfg.job.dump_folder)
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=cfg.comm.init_timeout_seconds)
        dist.init_process_group(backend, timeout=timeout, **_restart_safe_store(timeout))
    if dist.is_initialized():
        dims.build_mesh(device.type)
        # Mesh sub-groups get the backend's default timeout, not init_process_group's.
        flight_recorder.set_timeout(cfg.comm.init_timeout_seconds)
        if cfg.compile.enable:
            use_per_rank_compile_cache(rank)
    torch.manual_seed(cfg.training.seed)
    if cfg.training.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    gc.disable()
    gc.collect(1)


def shutdown_process(lock: run_lock.RunLock | None = None) -> None:
    """Undo ``init_process``: leave the process group, give garbage collection back; release
    the dump folder's ``lock`` (from ``start_locked_job``) last."""
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.enable()
    if lock is not None:
        lock.release()


class Preempted(SystemExit):
    """A stop request (SIGTERM, Ctrl-C) was handled: progress is saved (step >= 1), or the step
    could not finish because another rank is gone (step -1). The process exits with 128 + the
    signal (143 for SIGTERM, 130 for Ctrl-C); ``message`` is the one line that says so."""

    def __init__(self, step: int, signum: int = signal.SIGTERM, message: str = ""):
        super().__init__(128 + signum)
        self.step, self.signum = step, signum
        self.message = message or f"{stop_signal_name(signum)}: stopped at step {step}"

    def __str__(self) -> str:  # SystemExit's would be the exit code
        return self.message


def needs_flight_recorder_dump(error: BaseException) -> bool:
    """Dump only for communication failures, and for a stop whose step never finished (a peer
    is gone or hung); not for a user error, a non-finite loss, a data error or Ctrl-C."""
    if isinstance(error, Preempted):
        return error.step < 0
    return flight_recorder.is_communication_failure(error)


class PreemptionGuard:
    """Turns SIGTERM and Ctrl-C into a stop request the loop checks after each step; all ranks
    agree on it (``requested()``), then the trainer saves and raises ``Preempted``. A second
    Ctrl-C raises ``KeyboardInterrupt`` at once: nothing more is saved.

    torchrun forwards both signals to every rank (``torchtitan.launch`` forwards a second Ctrl-C
    too) and SIGKILLs the ranks after its shutdown timeout (``torchtitan.launch`` raises it where
    torch lets it). The step, validation or checkpoint save in progress when the signal comes is
    healthy work and takes what it needs. In a job with a process group, two waits are bounded
    by GRACE_SECONDS, after which the main thread gets SIGUSR1 and raises ``Preempted(-1)``
    there (a real signal also wakes a sleeping or waiting main thread), so the Flight Recorder
    dumps and the process exits before torchrun's SIGKILL:

    * the vote: from when this rank, with a stop request, reaches it; it never completes when
      another rank is gone or hung;
    * the step, when another rank of this node is gone: torchrun SIGTERMs the others when one
      failed, and SIGKILLs them 30 s later whatever its shutdown timeout.
    """

    GRACE_SECONDS = 20

    def __init__(self, timeout_seconds: int):
        self.timeout = timedelta(seconds=timeout_seconds)
        self._timers: list[threading.Timer] = []
        self._alarm = ""  # why the main thread gets SIGUSR1; "" after the vote completed

    def __enter__(self):
        self._signum = 0  # the first stop signal received
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNAL_NAMES:
                self._previous[signum] = signal.signal(signum, self._on_stop_signal)
            self._previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_sigusr1)
        # Its own CPU group: the per-step vote must not queue behind NCCL work.
        self._group = (
            dist.new_group(backend="gloo", timeout=self.timeout) if dist.is_initialized() else None
        )
        # This node's ranks are the children of torchrun's agent: fewer running means one is gone.
        self._node_ranks = self._running_node_ranks() if self._group is not None else 0
        return self

    def _on_stop_signal(self, signum, frame):
        if signum == signal.SIGINT and self._signum:
            raise KeyboardInterrupt  # Ctrl-C after a stop request: stop now, save nothing
        if self._signum:
            return
        self._signum = signum
        again = "; Ctrl-C again stops at once, without saving" if signum == signal.SIGINT else ""
        logger.warning("%s: stopping after this step%s", stop_signal_name(signum), again)
        if self._group is not None:
            self._alarm_after_grace(
                self._node_rank_gone,
                f"another rank of this node is gone and this step did not finish within "
                f"{self.GRACE_SECONDS} s; not saved",
            )

    @staticmethod
    def _running_node_ranks() -> int:
        return len(child_pids(os.getppid(), running_only=True))

    def _node_rank_gone(self) -> bool:
        return self._running_node_ranks() < self._node_ranks

    def _alarm_after_grace(self, condition, message: str) -> None:
        """GRACE_SECONDS from now, if ``condition()``: ``Preempted(-1)`` in the main thread."""

        def check():
            if condition():
                self._alarm = message
                signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

        timer = threading.Timer(self.GRACE_SECONDS, check)
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def _on_sigusr1(self, signum, frame):
        if not self._alarm:  # the vote completed just as the grace ran out
            return
        signum = self._signum or signal.SIGTERM
        raise Preempted(-1, signum, f"{stop_signal_name(signum)}: {self._alarm}")

    def requested(self) -> int:
        """The stop signal every rank agrees on (SIGTERM wins over Ctrl-C), or 0: go on."""
        if not dist.is_initialized():
            return self._signum
        vote = torch.tensor([float(self._signum)])
        if self._signum:  # a rank that is gone or hung would leave this vote waiting: bound it
            self._alarm_after_grace(
                lambda: True,
                f"the ranks did not agree to stop within {self.GRACE_SECONDS} s (another rank "
                "is gone or hung); not saved",
            )
        try:
            dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self._group)
        finally:
            self._cancel_alarms()  # every rank is alive and agreed: take the time to save
        return int(vote.item())

    def _cancel_alarms(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers, self._alarm = [], ""

    def __exit__(self, *exc):
        self._cancel_alarms()
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        return False


class LauncherWatch:
    """Under torchrun: stop this rank soon after its launcher (torchrun's agent, its parent
    process) dies without a word (SIGKILL). The rank runs in a session of its own, so nothing
    else would stop it: it would go on training and writing checkpoints into a folder that a
    relaunch is already using.

    A thread checks every ``POLL_SECONDS`` whether the parent process changed (rather than
    ``PR_SET_PDEATHSIG``, which fires when the parent's *thread* that started the rank ends,
    and kills without a word). When it did, the rank logs one line and ends at once
    (``os._exit``, code ``EXIT_CODE``): no checkpoint is started, and a save in progress stays
    ``step-N.tmp``, which the next run ignores and removes (complete steps are only ever made
    visible by a rename). Inert outside torchrun (no ``TORCHELASTIC_RUN_ID``): a plain process
    may outlive its shell (``nohup``).
    """

    POLL_SECONDS = 0.5
    EXIT_CODE = 128 + signal.SIGHUP  # as a hangup: its controlling process is gone

    def __init__(self, environ=os.environ):
        self.armed = "TORCHELASTIC_RUN_ID" in environ
        self._stop = threading.Event()

    def start(self) -> LauncherWatch:
        if self.armed:
            self._parent = os.getppid()
            thread = threading.Thread(target=self._watch, name="launcher-watch", daemon=True)
            thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.POLL_SECONDS):
            if os.getppid() != self._parent:
                self._launcher_gone()

    def _launcher_gone(self) -> None:
        logger.error(
            "the launcher (pid %d) is gone: stopping now, no checkpoint started (a save in "
            "progress stays step-N.tmp, which the next run removes)",
            self._parent,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(self.EXIT_CODE)

    def stop(self) -> None:
        self._stop.set()


def _restart_safe_store(timeout: timedelta) -> dict:
    """``init_process_group`` arguments that keep a torchrun restart off the last attempt's keys.

    torchrun's agent hosts one TCPStore for the whole job and every attempt's workers connect to
    it (``TORCHELASTIC_USE_AGENT_STORE``, same ``MASTER_PORT``), but ``env://`` does not prefix
    the keys per attempt (torch >= 2.4). A restarted rank then reads the previous attempt's gloo
    addresses (``default_pg/0/.../rank_<r>``) and connects to a dead port ("Gloo connectFullMesh
    failed ... Connection refused"), or finds stale barrier counts. Prefixing the store with
    ``TORCHELASTIC_RESTART_COUNT`` (what torch < 2.4 did) gives each attempt its own keys.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timeout,
    )
    return {
        "store": dist.PrefixStore(f"/worker/attempt_{attempt}/default_pg", store),
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
    }


def start_job(cfg: JobConfig) -> tuple[CheckedJob, str]:
    """``start_locked_job`` for a process that keeps the dump folder's lock until it exits."""
    job, run_id, lock = start_locked_job(cfg)
    if lock is not None:
        atexit.register(lock.release)
    return job, run_id


def start_locked_job(cfg: JobConfig) -> tuple[CheckedJob, str, run_lock.RunLock | None]:
    """Validate the job, take the dump folder's lock (``run_lock``; rank 0, unless the launcher
    holds it), set up this process, save the effective config and log one line about it;
    -> (job, run id, the lock this process took or None: release it when the run ends)."""
    job = check_job(cfg, env_world_size())
    run_id = new_run_id()
    lock, refused = _lock_dump_folder(cfg.job.dump_folder)
    try:
        init_process(cfg, job.dims, pick_device(), env_rank())
        _agree_on_lock(refused)
        for warning in job.warnings:
            logger.warning(warning)
        if env_rank() == 0:
            folder = Path(cfg.job.dump_folder) / "configs"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{run_id}.toml"
            path.write_text(cfg.to_toml())
            logger.info("config saved to %s; %s", path, config_changes(cfg))
    except BaseException:
        shutdown_process(lock)
        raise
    return job, run_id, lock


def _lock_dump_folder(dump_folder: str) -> tuple[run_lock.RunLock | None, ConfigError | None]:
    """On rank 0, before anything is written: (the lock, None) or (None, why not). (None, None)
    on the other ranks, where the launcher holds it, or where the filesystem has no locks (with
    a warning)."""
    if env_rank() != 0 or run_lock.held_by_launcher(dump_folder):
        return None, None
    try:
        lock = run_lock.acquire(dump_folder)
    except ConfigError as error:
        return None, error
    if lock is None:
        logger.warning(run_lock.unsupported_warning(dump_folder))
    elif lock.note:
        logger.warning(lock.note)
    return lock, None


def _agree_on_lock(error: ConfigError | None) -> None:
    """Every rank raises rank 0's lock error (another run holds the folder: exit code 2)."""
    box = [str(error) if error is not None else None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    if box[0] is not None:
        raise run_lock.FolderInUse(box[0])


def config_changes(cfg: JobConfig) -> str:
    """The options that differ from the defaults, as ``section.key=value``, in one line."""
    defaults = JobConfig()
    changed = []
    for section in dataclasses.fields(cfg):
        ours, theirs = getattr(cfg, section.name), getattr(defaults, section.name)
        for f in dataclasses.fields(ours):
            value = getattr(ours, f.name)
            if value != getattr(theirs, f.name):
                changed.append(f"{section.name}.{f.name}={_toml_value(value)}")
    if not changed:
        return "every option at its default"
    return "options that differ from the defaults: " + ", ".join(changed)
