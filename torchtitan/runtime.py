"""Process lifecycle: logging, device, process group and mesh, seeding, SIGTERM, restarts."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
from datetime import datetime, timedelta

import torch
import torch.distributed as dist

from torchtitan.config import JobConfig
from torchtitan.observability import flight_recorder
from torchtitan.parallel.compile import use_per_rank_compile_cache
from torchtitan.parallel.dims import ParallelDims


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
    """Unique per launch (a quick restart must not append to the previous run's files)."""
    return f"{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"


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


def shutdown_process() -> None:
    """Undo ``init_process``: leave the process group, give garbage collection back."""
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.enable()


class Preempted(SystemExit):
    """SIGTERM was handled: progress is saved (step >= 1), or the step could not finish because
    another rank is gone (step -1); the process exits with 143."""

    def __init__(self, step: int):
        super().__init__(143)
        self.step = step


class PreemptionGuard:
    """Turns SIGTERM into a flag the loop checks after each step; all ranks agree on it.

    torchrun also sends SIGTERM when another rank failed; then the step never finishes (or the
    vote never completes), so GRACE_SECONDS after the signal the main thread gets SIGUSR1, which
    raises ``Preempted`` there (a real signal also wakes a sleeping or waiting main thread): the
    Flight Recorder dumps and the process exits before torchrun's SIGKILL, 30 s after its SIGTERM.
    """

    GRACE_SECONDS = 20

    def __init__(self, timeout_seconds: int):
        self.timeout = timedelta(seconds=timeout_seconds)
        self._watchdog: threading.Timer | None = None

    def __enter__(self):
        self._flag = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._previous_usr1 = signal.signal(signal.SIGUSR1, self._on_sigusr1)
        # Its own CPU group: the per-step vote must not queue behind NCCL work.
        self._group = (
            dist.new_group(backend="gloo", timeout=self.timeout) if dist.is_initialized() else None
        )
        return self

    def _on_sigterm(self, signum, frame):
        self._flag = True
        if self._watchdog is None:
            self._watchdog = threading.Timer(self.GRACE_SECONDS, self._interrupt_main)
            self._watchdog.daemon = True
            self._watchdog.start()

    @staticmethod
    def _interrupt_main() -> None:
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    @staticmethod
    def _on_sigusr1(signum, frame):
        raise Preempted(-1)

    def requested(self) -> bool:
        if not dist.is_initialized():
            return self._flag
        flag = torch.tensor([float(self._flag)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        if flag.item() and self._watchdog is not None:
            self._watchdog.cancel()  # every rank is alive and agreed: take the time to save
        return bool(flag.item())

    def __exit__(self, *exc):
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            signal.signal(signal.SIGUSR1, self._previous_usr1)
        return False


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
