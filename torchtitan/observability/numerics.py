"""Stop (or skip) a training step whose loss or gradient norm is not finite."""

from __future__ import annotations

import math

import torch

from torchtitan.config import NonFinitePolicy, choices

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


def _is_fused(optimizer: torch.optim.Optimizer) -> bool:
    return all(group.get("fused") for group in optimizer.param_groups)


class NonFiniteGuard:
    """Applies ``training.on_nonfinite`` to every step without a host-device sync per step.

    With fused optimizers the step's finiteness (of the global mean loss and the global
    gradient norm, so every rank decides alike) goes to them as ``found_inf``, as a GradScaler
    would pass it: the fused kernels then leave the weights, moments and step count alone. The
    flag is read later, by ``resolve()``: the trainer calls it once the next step's forward
    and backward are queued, and before logging or checkpointing, so the GPU never waits for
    the host. Then ``stop`` raises ``NonFiniteError`` naming the step, ``skip`` logs it.
    With other optimizers (CPU foreach, for-loop) the values are read at once, as before.
    """

    def __init__(self, policy: str, optimizers: list[torch.optim.Optimizer], logger):
        self.policy = policy
        self.optimizers = optimizers
        self.logger = logger
        self.deferred = bool(optimizers) and all(_is_fused(o) for o in optimizers)
        self._pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def before_optimizer_step(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor):
        """-> whether the optimizers should step (always, when deferred: found_inf decides)."""
        if not self.deferred:
            return self._check(step, loss, grad_norm) == "ok"
        finite = torch.isfinite(loss.detach()) & torch.isfinite(grad_norm.detach())
        found_inf = (~finite).float()
        for optimizer in self.optimizers:
            optimizer.found_inf = found_inf
        self._pending.append((step, loss.detach(), grad_norm.detach()))
        return True

    def resolve(self) -> None:
        """Read the flags of the steps not checked yet; raise or log as the policy says."""
        pending, self._pending = self._pending, []
        for step, loss, grad_norm in pending:
            self._check(step, loss, grad_norm)

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
