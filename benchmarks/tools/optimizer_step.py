"""Time one optimizer step (gradient norm, clipping, AdamW) on a model's parameter shapes.

    python benchmarks/tools/optimizer_step.py --flavor 1B [--shard 4] [--device cuda]

Fills fp32 parameters and gradients of the flavor's shapes (each split ``--shard`` ways along
dim 0, as FSDP shards them) and times, with CUDA events, each way of doing the step, built
with the trainer's own ``build_optimizer`` and ``clip_grad_norm``:

* ``fused+clip``: the global norm, ``clip_grads_with_norm_``, then ``AdamW(fused=True)``;
* ``fused+scale``: the norm, then the fused kernel dividing by ``grad_scale`` (no clip pass);
* ``compiled+scale``: the norm, then ``CompiledAdamW`` (one compiled kernel per parameter);
* ``foreach+clip``: the norm, clip, ``AdamW(foreach=True)``;
* with ``--compiled-kernels``, ``CompiledAdamW``'s step alone (no norm) with its kernel compiled
  each way of ``KERNELS``: dynamic sizes (the default), static sizes (one kernel per shape), and
  each with inductor's coordinate-descent tuning.

Prints milliseconds per step (median) and the bandwidth that 28 bytes per parameter (read
weight, gradient and moments, write weight and moments) would need at that time, and checks
that every variant's weights end within 1e-5 of the first's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from torchtitan.config import Optimizer
from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.optim import build_optimizer, clip_grad_norm

MAX_NORM = 1.0
STEP_BYTES_PER_PARAM = 28


def shapes(flavor: str, shard: int) -> list[tuple[int, ...]]:
    with torch.device("meta"):
        model = Transformer(get_model_args(flavor))
    out = []
    for p in model.parameters():
        first = -(-p.shape[0] // shard)
        out.append((first, *p.shape[1:]))
    return out


def make_params(sizes, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    params = []
    for s in sizes:
        p = torch.nn.Parameter(torch.randn(s, generator=gen, device=device) * 0.02)
        p.grad = torch.randn(s, generator=gen, device=device)
        params.append(p)
    return params


# name: (--optimizer.implementation or "compiled" for --experimental.compiled_adamw, whether
# clipping goes to the kernel as grad_scale)
VARIANTS = {
    "fused+clip": ("fused", False),
    "fused+scale": ("fused", True),
    "compiled+scale": ("compiled", True),
    "foreach+clip": ("foreach", False),
}


def build_step(params, implementation: str, fold_clipping: bool, device):
    """The trainer's optimizer work for one step: ``clip_grad_norm``, then ``step``."""
    compiled = implementation == "compiled"
    impl = "auto" if compiled else implementation
    cfg = Optimizer(lr=3e-4, beta2=0.999, weight_decay=0.1, implementation=impl)
    opt = build_optimizer(params, cfg, device.type, compiled_adamw=compiled)
    if fold_clipping:
        opt.found_inf = torch.zeros((), device=device)
    takes_clipping = [opt] if fold_clipping else []

    def step():
        clip_grad_norm(params, MAX_NORM, optimizers=takes_clipping)
        opt.step()

    return step


# name: torch.compile keyword arguments for ``compiled_adamw._adam_update``
KERNELS = {
    "compiled, dynamic": dict(dynamic=True),
    "compiled, static": dict(dynamic=False),
    "compiled, dynamic, tuned": dict(dynamic=True, options={"coordinate_descent_tuning": True}),
    "compiled, static, tuned": dict(dynamic=False, options={"coordinate_descent_tuning": True}),
}


def time_kernel(kwargs: dict, sizes, device, warmup: int, iters: int):
    """``CompiledAdamW``'s step alone, its update compiled with ``kwargs``."""
    from torchtitan.experimental import compiled_adamw

    torch._dynamo.reset()
    compiled_adamw._compiled_update = torch.compile(
        compiled_adamw._adam_update, fullgraph=True, **kwargs
    )
    params = make_params(sizes, device)
    cfg = Optimizer(lr=3e-4, beta2=0.999, weight_decay=0.1)
    opt = build_optimizer(params, cfg, device.type, compiled_adamw=True)
    for _ in range(warmup):
        opt.step()
    times = [elapsed_ms(opt.step, device) for _ in range(iters)]
    compiled_adamw._compiled_update = None
    return statistics.median(times)


def elapsed_ms(fn, device) -> float:
    if device.type != "cuda":  # a smoke run of this script on CPU
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def time_variant(variant, sizes, device, warmup: int, iters: int):
    params = make_params(sizes, device)
    grads = [p.grad.clone() for p in params]
    step = build_step(params, *variant, device)
    times = []
    for i in range(warmup + iters):
        for p, g in zip(params, grads):
            p.grad.copy_(g)  # clipping / grad_scale write the gradients: start each step alike
        if i >= warmup:
            times.append(elapsed_ms(step, device))
        else:
            step()
    return statistics.median(times), [p.detach() for p in params]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flavor", default="1B")
    ap.add_argument("--shard", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--compiled-kernels", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    sizes = shapes(args.flavor, args.shard)
    numel = sum(torch.Size(s).numel() for s in sizes)
    print(
        f"{args.flavor} / {args.shard}: {len(sizes)} tensors, {numel / 1e9:.3f} B parameters, "
        f"{torch.cuda.get_device_name(0) if device.type == 'cuda' else 'CPU'}"
    )
    first = None
    for name, variant in VARIANTS.items():
        ms, weights = time_variant(variant, sizes, device, args.warmup, args.iters)
        gbps = numel * STEP_BYTES_PER_PARAM / (ms * 1e-3) / 1e9
        if first is None:
            first, diff = weights, 0.0
        else:
            diff = max((a - b).abs().max().item() for a, b in zip(first, weights))
        print(f"  {name:16s} {ms:8.2f} ms   {gbps:7.0f} GB/s at 28 B/param   max |dw| {diff:.1e}")
        assert diff < 1e-5, f"{name} weights differ from the first variant's by {diff}"
    if args.compiled_kernels:
        for name, kwargs in KERNELS.items():
            ms = time_kernel(kwargs, sizes, device, args.warmup, args.iters)
            gbps = numel * STEP_BYTES_PER_PARAM / (ms * 1e-3) / 1e9
            print(f"  step only, {name:26s} {ms:8.2f} ms   {gbps:7.0f} GB/s at 28 B/param")


if __name__ == "__main__":
    main()
