"""Adam/AdamW with the update of each parameter in one ``torch.compile``'d elementwise kernel.

Why: the update is memory-bound (read weight, gradient and both moments; write weight and
moments: 28 bytes per fp32 parameter), and PyTorch's fused multi-tensor kernel reaches well
under the GPU's bandwidth on large tensors (docs/performance.md has the measurement). One
compiled pointwise kernel per parameter streams each tensor at close to bandwidth, and it takes
gradient clipping (``grad_scale``) and the non-finite skip (``found_inf``) in the same pass, as
the fused kernel does, without writing the unscaled gradient back.

The optimizer is ``torch.optim.AdamW`` (or ``Adam``) in everything but ``step``: same param
groups, same state (``step``, ``exp_avg``, ``exp_avg_sq`` per parameter, ``step`` on the
parameter's device as under ``fused``), so checkpoints move freely between implementations.
The kernel is compiled once with dynamic sizes and reused for every parameter.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def _adam_update(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: torch.Tensor,
    hyper: torch.Tensor,
    grad_scale: torch.Tensor,
    found_inf: torch.Tensor,
    decoupled: bool,
) -> None:
    """One Adam(W) step of a flat parameter, in place; a no-op where ``found_inf`` is 1.

    ``hyper``: fp32 [lr, beta1, beta2, eps, weight_decay] on the parameter's device. They are
    a tensor, not Python floats, because with ``dynamic=True`` torch 2.13 makes a float that
    changes between calls symbolic, and that recompiled kernel computed wrong updates (tested
    against eager: the unit tests call it with several hyperparameter sets).
    """
    lr, beta1, beta2, eps, weight_decay = hyper.unbind()
    skip = found_inf > 0
    new_step = step + (1.0 - found_inf)
    g = grad.float() / grad_scale
    p = param.float()
    if decoupled:
        p = p * (1.0 - lr * weight_decay)
    else:
        g = g + weight_decay * p
    m = exp_avg + (g - exp_avg) * (1.0 - beta1)
    v = exp_avg_sq * beta2 + (g * g) * (1.0 - beta2)
    bias_correction1 = 1.0 - torch.pow(beta1, new_step)
    bias_correction2 = 1.0 - torch.pow(beta2, new_step)
    denom = v.sqrt() / bias_correction2.sqrt() + eps
    p = p - (lr / bias_correction1) * m / denom
    param.copy_(torch.where(skip, param, p.to(param.dtype)))
    exp_avg.copy_(torch.where(skip, exp_avg, m))
    exp_avg_sq.copy_(torch.where(skip, exp_avg_sq, v))
    step.copy_(new_step)


_compiled_update = None


def compiled_update():
    """The compiled ``_adam_update`` (one kernel for every size), built on first use."""
    global _compiled_update
    if _compiled_update is None:
        _compiled_update = torch.compile(_adam_update, dynamic=True, fullgraph=True)
    return _compiled_update


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _flat(local: torch.Tensor) -> torch.Tensor:
    """The elements of a contiguous tensor as a 1-D tensor on the same storage that is not a
    view, so one kernel serves every parameter shape. A flattened *view* of an FSDP2 shard
    (itself a view into a padded buffer) failed in dynamo with ``dynamic=True`` (torch 2.11:
    "unbound symbols [s24, s39] in s24*s39"); a tensor without a view base has only its size."""
    flat = torch.empty(0, dtype=local.dtype, device=local.device)
    return flat.set_(local.untyped_storage(), local.storage_offset(), (local.numel(),), (1,))


def kernel_operands(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Local tensors flattened when all are contiguous; else as they are (same shapes)."""
    local = [_local(t) for t in tensors]
    if all(t.is_contiguous() for t in local):
        return [_flat(t) for t in local]
    return local


class CompiledAdamMixin:
    """``step`` for an Adam-family optimizer: one compiled kernel per parameter.

    ``grad_scale`` and ``found_inf`` (0-d float tensors on the parameters' device, set as
    attributes like a GradScaler sets them for the fused kernels): gradients are divided by
    ``grad_scale``; with ``found_inf`` 1 nothing changes (weights, moments, step count).
    """

    # AdamW's weight decay; torch 2.13's param groups also say it ("decoupled_weight_decay").
    decoupled_weight_decay = True
    takes_scale_and_skip = True  # torchtitan.optim.takes_scale_and_skip

    def _scalar(self, name: str, device: torch.device, value: float) -> torch.Tensor:
        """A cached 0-d fp32 tensor on ``device``, ``value`` when first made."""
        cache = self.__dict__.setdefault("_scalars", {})
        if (name, device) not in cache:
            cache[(name, device)] = torch.full((), value, dtype=torch.float32, device=device)
        return cache[(name, device)]

    def _hyper(self, index: int, group: dict, device: torch.device) -> torch.Tensor:
        """Group ``index``'s [lr, beta1, beta2, eps, weight_decay] on ``device``, refreshed with
        an async copy (the lr changes every step; no host-device sync)."""
        beta1, beta2 = group["betas"]
        values = [float(group["lr"]), beta1, beta2, group["eps"], group["weight_decay"]]
        cache = self.__dict__.setdefault("_hypers", {})
        if (index, device) not in cache:
            cache[(index, device)] = torch.zeros(5, dtype=torch.float32, device=device)
        host = torch.tensor(values, dtype=torch.float32)
        if device.type == "cuda":
            host = host.pin_memory()
        # Kernels read it when they run; this copy is queued after the last step's kernels.
        return cache[(index, device)].copy_(host, non_blocking=True)

    def _scale_and_skip(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        if grad_scale is None:
            grad_scale = self._scalar("one", device, 1.0)
        if found_inf is None:
            found_inf = self._scalar("zero", device, 0.0)
        return grad_scale, found_inf

    def _state_of(self, param: torch.Tensor) -> dict:
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        update = compiled_update()
        for index, group in enumerate(self.param_groups):
            hypers: dict[torch.device, torch.Tensor] = {}
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self._state_of(param)
                operands = kernel_operands(param, param.grad, state["exp_avg"], state["exp_avg_sq"])
                device = operands[0].device
                if device not in hypers:
                    hypers[device] = self._hyper(index, group, device)
                update(
                    *operands,
                    state["step"],
                    hypers[device],
                    *self._scale_and_skip(device),
                    group.get("decoupled_weight_decay", self.decoupled_weight_decay),
                )
        return loss


class CompiledAdamW(CompiledAdamMixin, torch.optim.AdamW):
    def __init__(self, params, **kwargs):
        super().__init__(params, foreach=False, fused=False, capturable=True, **kwargs)


class CompiledAdam(CompiledAdamMixin, torch.optim.Adam):
    decoupled_weight_decay = False

    def __init__(self, params, **kwargs):
        super().__init__(params, foreach=False, fused=False, capturable=True, **kwargs)


COMPILED = {"AdamW": CompiledAdamW, "Adam": CompiledAdam}
