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
