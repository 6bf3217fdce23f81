"""Fault-tolerance mistakes a user can make, found before any process group: each a one-line
reason (``None`` when there is none), raised by preflight as a ``ConfigError``."""

from __future__ import annotations

import logging
import os
import socket
from urllib.parse import urlsplit

from torchtitan.config import FaultTolerance, JobConfig
from torchtitan.parallel.dims import ParallelDims

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
KEY = "--fault_tolerance"


def replica_groups(cfg: JobConfig) -> int:
    """Replica groups that share the global batch: ``group_size`` with fault tolerance, else 1."""
    ft = cfg.fault_tolerance
    return ft.group_size if ft.enable else 1


def import_torchft():
    """``import torchft``, its per-step logs quiet: its servers' (Rust) and its quorum and
    commit records go to the console only at warning level unless ``RUST_LOG`` says
    otherwise (``RUST_LOG=info`` shows every quorum and commit)."""
    os.environ.setdefault("RUST_LOG", "warn")
    import torchft

    for name in ("torchft", "torchft_quorums", "torchft_commits"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return torchft


def lighthouse_address(ft: FaultTolerance) -> str:
    return ft.lighthouse or os.environ.get(LIGHTHOUSE_ENV, "")


def fault_tolerance_problem(cfg: JobConfig, dims: ParallelDims, model_args=None) -> str | None:
    """Why this job cannot run with fault tolerance, in one line; None when it can (or is off)."""
    ft = cfg.fault_tolerance
    if not ft.enable:
        return None
    try:
        import_torchft()
    except Exception as error:  # ImportError, or a dependency of torchft that fails to import
        return (
            f"{KEY}.enable needs torchft: pip install -e '.[ft]' (the 'ft' extra pins the "
            f"versions it imports with); importing it failed: {type(error).__name__}: {error}"
        )
    if dims.dp_replicate > 1:
        return (
            f"with {KEY}.enable the replica groups take the place of "
            "--parallelism.data_parallel_replicate_degree; set it to 1 and start "
            f"{KEY}.group_size groups"
        )
    if ft.semi_sync != "none" and dims.pp > 1:
        return (
            f"{KEY}.semi_sync {ft.semi_sync} wraps one model and one optimizer per rank; it does "
            "not run with pipeline parallelism (use semi_sync none, or no PP)"
        )
    moe = getattr(model_args, "moe", None)
    if ft.semi_sync != "none" and moe is not None and moe.balance_bias:
        return (
            f"{KEY}.semi_sync {ft.semi_sync} averages parameters only, so the MoE selection "
            "biases (buffers) would drift apart between groups; set --model.moe_balance_bias "
            "false (balance with --model.moe_aux_loss_coeff instead) or semi_sync none"
        )
    return lighthouse_problem(ft)


def lighthouse_problem(ft: FaultTolerance) -> str | None:
    """The lighthouse address is missing, malformed, or nothing answers there in time."""
    address = lighthouse_address(ft)
    start = "start one with: torchft_lighthouse --min_replicas 1 --bind [::]:29510"
    if not address:
        return (
            f"{KEY}.enable needs the torchft lighthouse: set {KEY}.lighthouse http://HOST:PORT "
            f"or {LIGHTHOUSE_ENV} ({start})"
        )
    parts = urlsplit(address)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if parts.scheme != "http" or not host or port is None:
        return f"{KEY}.lighthouse must look like http://HOST:PORT; got {address!r}"
    try:
        socket.create_connection((host, port), timeout=ft.connect_timeout_seconds).close()
    except OSError as error:
        return (
            f"the torchft lighthouse at {address} did not answer within "
            f"{ft.connect_timeout_seconds} s ({error.strerror or error}); {start}, or fix "
            f"{KEY}.lighthouse / {LIGHTHOUSE_ENV}"
        )
    return None
