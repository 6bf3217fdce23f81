"""GPU time of one Adam(W) step, the kernels alone: torch's fused kernel, ``CompiledAdamW`` (one
compiled pointwise kernel per parameter, its step count and bias corrections computed inside
each), and a trial of the same kernel with the per-parameter scalars (step count, ``lr / (1 -
beta1^t)``, ``sqrt(1 - beta2^t)``) computed beforehand by a few multi-tensor kernels (call 95:
slower on the GPU, so not in the library; docs/performance.md, finding 32).

    python scripts/bench/adam_kernel_time.py [--flavor 1B] [--iters 20]

Each step is timed twice: from its first launch (``wall``: the host's launches included) and
queued behind a 100 ms GPU sleep (``GPU``: the kernels alone). Prints milliseconds (median) and
the bandwidth 28 bytes per parameter would need at the GPU time, and how far each variant's
weights end from the first's.
"""

from __future__ import annotations

import argparse

import torch
from cuda_timing import median_ms
from optimizer_step import STEP_BYTES_PER_PARAM, make_params, shapes

from torchtitan.compiled_adamw import CompiledAdamW

KWARGS = dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)


def _streaming_update(param, grad, exp_avg, exp_avg_sq, step_size, bc2_sqrt, hyper, found_inf):
    """CompiledAdamW's update (AdamW, grad_scale 1) with the per-parameter scalars as inputs."""
    lr, beta1, beta2, eps, weight_decay = hyper.unbind()
    skip = found_inf > 0
    g = grad.float()
    p = param.float() * (1.0 - lr * weight_decay)
    m = exp_avg + (g - exp_avg) * (1.0 - beta1)
    v = exp_avg_sq * beta2 + (g * g) * (1.0 - beta2)
    p = p - step_size * m / (v.sqrt() / bc2_sqrt + eps)
    param.copy_(torch.where(skip, param, p.to(param.dtype)))
    exp_avg.copy_(torch.where(skip, exp_avg, m))
    exp_avg_sq.copy_(torch.where(skip, exp_avg_sq, v))


class PrecomputedScalarsAdamW(CompiledAdamW):
    """The trial: step counts and bias corrections in multi-tensor kernels, then one compiled
    streaming kernel per parameter."""

    update = None

    @torch.no_grad()
    def step(self, closure=None):
        if PrecomputedScalarsAdamW.update is None:
            PrecomputedScalarsAdamW.update = torch.compile(
                _streaming_update, dynamic=True, fullgraph=True
            )
        group = self.param_groups[0]
        params = [p for p in group["params"] if p.grad is not None]
        device = params[0].device
        states = [self._state_of(p) for p in params]
        steps = [s["step"] for s in states]
        _, found_inf = self._scale_and_skip(device)
        torch._foreach_add_(steps, 1.0 - found_inf)
        beta1, beta2 = group["betas"]
        step_size = torch._foreach_pow(beta1, steps)
        torch._foreach_mul_(step_size, -1.0)
        torch._foreach_add_(step_size, 1.0)
        torch._foreach_reciprocal_(step_size)
        hyper = self._hyper(0, group, device)
        torch._foreach_mul_(step_size, hyper[0])
        bc2_sqrt = torch._foreach_pow(beta2, steps)
        torch._foreach_mul_(bc2_sqrt, -1.0)
        torch._foreach_add_(bc2_sqrt, 1.0)
        torch._foreach_sqrt_(bc2_sqrt)
        for p, s, size, bc2 in zip(params, states, step_size, bc2_sqrt):
            flat = [t.view(-1) for t in (p, p.grad, s["exp_avg"], s["exp_avg_sq"])]
            PrecomputedScalarsAdamW.update(*flat, size, bc2, hyper, found_inf)


VARIANTS = {
    "fused (torch)": lambda params: torch.optim.AdamW(params, fused=True, **KWARGS),
    "compiled, per parameter": lambda params: CompiledAdamW(params, **KWARGS),
    "compiled, scalars first": lambda params: PrecomputedScalarsAdamW(params, **KWARGS),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flavor", default="1B")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    sizes = shapes(args.flavor, 1)
    numel = sum(torch.Size(s).numel() for s in sizes)
    print(
        f"{args.flavor}: {len(sizes)} tensors, {numel / 1e9:.3f} B, {torch.cuda.get_device_name()}"
    )
    first = None
    for name, build in VARIANTS.items():
        params = make_params(sizes, torch.device("cuda"))
        opt = build(params)
        wall = median_ms(opt.step, args.iters, warmup=3)
        gpu = median_ms(opt.step, args.iters, queued=True)
        gbps = numel * STEP_BYTES_PER_PARAM / (gpu * 1e-3) / 1e9
        weights = [p.detach() for p in params]
        diff = (
            0.0
            if first is None
            else max((a - b).abs().max().item() for a, b in zip(first, weights))
        )
        first = first or weights
        print(f"  {name:26s} wall {wall:7.2f} ms   GPU {gpu:7.2f} ms   {gbps:5.0f} GB/s", end="")
        print(f"   max |dw| {diff:.1e}")


if __name__ == "__main__":
    main()
