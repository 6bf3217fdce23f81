"""Stop (or skip) a training step whose loss or gradient norm is not finite."""

from __future__ import annotations

import math

import torch

from torchtitan.config import NonFinitePolicy, choices
from torchtitan.optim import takes_scale_and_skip

POLICIES = choices(NonFinitePolicy)


class NonFiniteError(RuntimeError):
    """A non-finite loss or gradient norm under the ``stop`` policy; the message is one line."""


def _value(x) -> float:
    if isinstance(x, torch.Tensor):
        if hasattr(x, "full_tensor"):  # DTensor
            x = x.full_tensor()
        return float(x.detach().float().item())
    return float(x)


def _kind(v: float) -> str:
    return "nan" if math.isnan(v) else ("+inf" if v > 0 else "-inf")


def check_finite(loss, grad_norm, step: int, policy: str = "stop") -> str:
    """``"ok"`` if both are finite; else raise ``NonFiniteError`` (stop) or return ``"skip"``.

    ``loss`` and ``grad_norm`` are floats or 0-d tensors (read with ``.item()``, a device sync;
    pass the values the trainer already fetched to avoid a second one); ``grad_norm`` may be None.
    For every rank to decide alike, pass values that are the same on every rank (the loss
    averaged over data parallel, the global gradient norm).
    """
    if policy not in POLICIES:
        raise ValueError(
            f"on_nonfinite policy must be one of {', '.join(POLICIES)}; got {policy!r}"
        )
    loss_v = _value(loss)
    norm_v = None if grad_norm is None else _value(grad_norm)
    bad = []
    if not math.isfinite(loss_v):
        bad.append(f"loss ({_kind(loss_v)})")
    if norm_v is not None and not math.isfinite(norm_v):
        bad.append(f"grad_norm ({_kind(norm_v)})")
    if not bad:
        return "ok"
    if policy == "skip":
        return "skip"
    values = f"loss={loss_v:g}" + ("" if norm_v is None else f", grad_norm={norm_v:g}")
    raise NonFiniteError(
        f"non-finite {' and '.join(bad)} at step {step} ({values}); lower the learning rate, "
        "check the data, or set training.on_nonfinite=skip to skip such steps"
    )


class _Pending:
    """One step's loss and grad norm on their way to the host: on CUDA a non-blocking copy into
    pinned memory and an event that says when it landed, so they can be read without waiting
    for the GPU."""

    def __init__(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor):
        self.step = step
        values = torch.stack([loss.detach().float().reshape(()), grad_norm.detach().float()])
        self.event = None
        if values.is_cuda:
            self.values = torch.empty(2, dtype=torch.float32, pin_memory=True)
            self.values.copy_(values, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.values = values

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def read(self) -> tuple[float, float]:
        if self.event is not None:
            self.event.synchronize()
        loss, grad_norm = self.values.tolist()
        return loss, grad_norm


class NonFiniteGuard:
    """Applies ``training.on_nonfinite`` to every step without a host-device sync per step.

    With optimizers whose kernels take ``found_inf`` (fused, compiled) the step's finiteness
    (of the global mean loss and the global gradient norm, so every rank decides alike) goes to
    them as ``found_inf``, as a GradScaler would pass it: the kernels then leave the weights,
    moments and step count alone. The values travel to pinned host memory asynchronously;
    ``resolve()`` acts on those that have arrived (the trainer calls it every step: no wait)
    and, with ``wait=True``, on all of them (the trainer does that before logging,
    checkpointing and stopping, which read the GPU anyway). Then ``stop`` raises
    ``NonFiniteError`` naming the step, ``skip`` logs it. With other optimizers (CPU foreach,
    for-loop) the values are read at once, as before.
    """

    def __init__(self, policy: str, optimizers: list[torch.optim.Optimizer], logger):
        self.policy = policy
        self.optimizers = optimizers
        self.logger = logger
        self.deferred = bool(optimizers) and all(takes_scale_and_skip(o) for o in optimizers)
        self._pending: list[_Pending] = []

    def before_optimizer_step(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor):
        """-> whether the optimizers should step (always, when deferred: found_inf decides)."""
        if not self.deferred:
            return self._check(step, loss, grad_norm) == "ok"
        finite = torch.isfinite(loss.detach()) & torch.isfinite(grad_norm.detach())
        found_inf = (~finite).float()
        for optimizer in self.optimizers:
            optimizer.found_inf = found_inf
        self._pending.append(_Pending(step, loss, grad_norm))
        return True

    def resolve(self, wait: bool = False) -> None:
        """Check the steps whose values reached the host (all of them with ``wait``), in
        order; raise or log as the policy says."""
        while self._pending and (wait or self._pending[0].ready()):
            pending = self._pending.pop(0)
            self._check(pending.step, *pending.read())

    def _check(self, step: int, loss, grad_norm) -> str:
        result = check_finite(loss, grad_norm, step, self.policy)
        if result == "skip":
            self.logger.warning(
                "step %d skipped: non-finite loss %g or grad norm %g",
                step,
                _value(loss),
                _value(grad_norm),
            )
        return result
