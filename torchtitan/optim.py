"""Optimizer, learning-rate schedule and gradient clipping."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from torchtitan.config import ConfigError, LRScheduler, Optimizer

OPTIMIZERS = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam}


def build_optimizer(
    params, cfg: Optimizer, device_type: str, compiled_adamw: bool = False
) -> torch.optim.Optimizer:
    """The optimizer ``cfg`` names over ``params``; with ``compiled_adamw`` (the experimental
    switch, CUDA only) its update runs as one compiled kernel per parameter."""
    params = list(params)
    distributed = any(isinstance(p, DTensor) for p in params)
    kwargs = dict(
        lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    if compiled_adamw and device_type == "cuda":
        check_optimizer(compiled_adamw, distributed)
        from torchtitan.experimental.compiled_adamw import COMPILED

        return COMPILED[cfg.name](params, **kwargs)
    impl = resolve_implementation(cfg.implementation, device_type)
    cls = OPTIMIZERS[cfg.name]
    return cls(params, fused=impl == "fused", foreach=impl == "foreach", **kwargs)


COMPILED_NEEDS_WHOLE_PARAMETERS = (
    "--experimental.compiled_adamw takes whole parameters, and this layout shards or "
    "replicates them (data, context or tensor parallel degree > 1); turn it off"
)


def resolve_implementation(implementation: str, device_type: str) -> str:
    """``auto``: torch's fused kernel on CUDA, ``foreach`` elsewhere."""
    if implementation != "auto":
        return implementation
    return "fused" if device_type == "cuda" else "foreach"


def check_optimizer(compiled_adamw: bool, parameters_distributed: bool) -> None:
    """The compiled update only where parameters stay whole tensors (on FSDP2 shards it failed
    with an illegal memory access on an H100, torch 2.11): checked by preflight from the layout,
    and again by ``build_optimizer`` from the parameters themselves."""
    if compiled_adamw and parameters_distributed:
        raise ConfigError(COMPILED_NEEDS_WHOLE_PARAMETERS)


def takes_scale_and_skip(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` honours ``grad_scale`` and ``found_inf`` attributes (as set by a
    GradScaler): the fused kernels and the compiled update do, the others ignore them."""
    if getattr(optimizer, "takes_scale_and_skip", False):
        return True
    return all(group.get("fused") for group in optimizer.param_groups)


def lr_factor(step: int, total_steps: int, cfg: LRScheduler) -> float:
    """Multiplier of the peak lr for 1-indexed optimizer step ``step``.

    Linear warmup reaches the peak at ``warmup_steps`` (step 1 already trains, at lr/warmup), then
    decays (linear or cosine) to ``min_lr_ratio`` at ``total_steps``.
    """
    warmup = cfg.warmup_steps
    if step <= warmup:
        return step / warmup
    if cfg.decay_type == "none" or total_steps <= warmup:
        return 1.0
    progress = min((step - warmup) / (total_steps - warmup), 1.0)
    if cfg.decay_type == "linear":
        decay = 1.0 - progress
    else:
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * decay


def build_lr_scheduler(optimizer, total_steps: int, cfg: LRScheduler) -> LambdaLR:
    """LambdaLR counts from 0 at construction; optimizer step k (1-indexed) then uses factor(k)."""
    return LambdaLR(optimizer, lambda last: lr_factor(last + 1, total_steps, cfg))


def resume_lr_scheduler(scheduler, saved: dict) -> None:
    """Continue ``scheduler`` from a checkpoint's scheduler state ``saved``; set its optimizer's
    lr for the next step (load the optimizer's state first, or set the lr again after it).

    The schedule is a function of (step, training.steps, lr and [lr_scheduler] config), so for
    a ``LambdaLR`` only the step count is restored: its lambda and peak lr stay this run's,
    built from the current config, and apply from the first resumed step on (a checkpoint's
    last lr was computed by the old schedule). Other schedulers load their whole state.
    """
    if isinstance(scheduler, LambdaLR):
        steps = int(saved["last_epoch"])
        factors = [fn(steps) for fn in scheduler.lr_lambdas]
        scheduler.load_state_dict(
            {
                "last_epoch": steps,
                "_step_count": int(saved.get("_step_count", steps + 1)),
                "_last_lr": [base * f for base, f in zip(scheduler.base_lrs, factors)],
                "lr_lambdas": [None] * len(factors),
            }
        )
    else:
        scheduler.load_state_dict(saved)
    apply_schedule_lr(scheduler)


def apply_schedule_lr(scheduler) -> None:
    """Set the scheduler's optimizer's lr to the schedule's lr for the next step."""
    for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr()):
        group["lr"] = lr


def clip_grad_norm(params, max_norm: float, pp_group=None, optimizers=()) -> torch.Tensor:
    """Total L2 norm of all gradients (before clipping); clips when max_norm > 0.

    Clipping multiplies every gradient by ``min(1, max_norm / (norm + 1e-6))``. When every one
    of ``optimizers`` takes a ``grad_scale`` (``takes_scale_and_skip``), the divisor goes to them
    instead and their kernels apply it while they read the gradients: one pass over the
    gradients fewer. Otherwise the gradients are scaled in place here.

    Sharded (DTensor) gradients give the norm of the full gradients, reduced over their mesh;
    under pipeline parallelism each rank holds other parameters, so the squared norms are also
    summed over ``pp_group``.
    On CPU the norm is accumulated in float64: an fp32 CPU norm of a large, mostly tiny gradient
    (the output head's) is off by ~1e-4 relative, more than the layouts differ by.
    """
    params = [p for p in params if p.grad is not None]
    norm = _total_norm([p.grad for p in params])
    if pp_group is not None:
        squared = norm**2
        dist.all_reduce(squared, group=pp_group)
        norm = squared.sqrt()
    if max_norm <= 0:
        return norm
    if optimizers and all(takes_scale_and_skip(o) for o in optimizers):
        grad_scale = torch.clamp((norm.detach() + 1e-6) / max_norm, min=1.0).float()
        for optimizer in optimizers:
            optimizer.grad_scale = grad_scale
    else:
        for same_mesh in _by_mesh(params).values():
            torch.nn.utils.clip_grads_with_norm_(same_mesh, max_norm, norm, foreach=True)
    return norm


def _by_mesh(tensors: list) -> dict:
    """Tensors grouped by DTensor mesh (plain tensors under None): DTensor ops take one mesh,
    and MoE expert weights live on another mesh than the dense ones."""
    groups: dict = {}
    for t in tensors:
        groups.setdefault(t.device_mesh if isinstance(t, DTensor) else None, []).append(t)
    return groups


def _total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of ``grads`` (float64 on CPU), full over each DTensor's mesh."""
    if grads and grads[0].device.type == "cpu":
        grads = [g.double() for g in grads]
    norms = []
    for same_mesh in _by_mesh(grads).values():
        norm = torch.nn.utils.get_total_norm(same_mesh, norm_type=2.0, foreach=True)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if len(norms) == 1:
        return norms[0]
    return torch.stack(norms).square().sum().sqrt()
