"""Time causal attention forward + backward per SDPA backend at the benchmark models' shapes.

    python benchmarks/tools/attention_backends.py [--shapes 8b,1b,8b_tp2] [--iters 20]

For each shape (batch, query heads, K/V heads, sequence, head dim) and each way of calling SDPA
(the backend picked by default, or forced with ``sdpa_kernel``; grouped K/V passed as they are
with ``enable_gqa`` or repeated first), prints the median milliseconds of forward + backward
(CUDA events), the TFLOP/s that works out to (causal: half the score matrix), the kernels the
default choice launched (profiler), and the largest difference of its output and input gradients
from the default's. A backend that refuses the inputs prints why. Q, K and V are strided as
the model makes them: (batch, sequence, heads, head dim) transposed to (batch, heads, ...).
"""

from __future__ import annotations

import argparse
import functools
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = {  # batch, query heads, K/V heads, sequence, head dim
    "8b": (1, 32, 8, 8192, 128),
    "8b_tp2": (1, 16, 4, 8192, 128),
    "1b": (2, 32, 8, 8192, 64),
}
BACKENDS = {
    "default": None,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def inputs(shape, device, dtype=torch.bfloat16):
    b, hq, hkv, s, d = shape
    gen = torch.Generator(device=device).manual_seed(0)

    def make(heads):
        t = torch.randn(b, s, heads, d, device=device, dtype=dtype, generator=gen)
        return t.transpose(1, 2).requires_grad_()

    return make(hq), make(hkv), make(hkv), torch.randn(b, hq, s, d, device=device, dtype=dtype)


def attention(q, k, v, gqa: bool):
    if gqa:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    rep = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(rep, dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def step(q, k, v, grad, backend, gqa):
    for t in (q, k, v):
        t.grad = None
    if backend is None:
        out = attention(q, k, v, gqa)
    else:
        with sdpa_kernel([backend]):
            out = attention(q, k, v, gqa)
    out.backward(grad)
    return out


def time_ms(fn, iters: int) -> float:
    times = []
    for _ in range(iters):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernels(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages() if e.device_type.name == "CUDA"}
    return sorted(n[:90] for n in names if "elementwise" not in n.lower())


def run_shape(name: str, shape, iters: int) -> None:
    b, hq, hkv, s, d = shape
    flops = 4 * b * hq * s * s * d / 2 * 3.5  # causal forward (2 matmuls) + backward (2.5x)
    q, k, v, grad = inputs(shape, "cuda")
    print(f"\n{name}: batch {b}, heads {hq}/{hkv}, seq {s}, head dim {d}")
    ref = None
    for label, backend in BACKENDS.items():
        for gqa in (True, False):
            tag = f"{label:9s} {'enable_gqa' if gqa else 'repeat_kv '}"
            try:
                out = step(q, k, v, grad, backend, gqa)
            except RuntimeError as err:
                print(f"  {tag}  refused: {str(err).splitlines()[0][:100]}")
                continue
            result = [out.detach()] + [t.grad.detach().clone() for t in (q, k, v)]
            if ref is None:
                ref = result
            diff = max((a.float() - r.float()).abs().max().item() for a, r in zip(result, ref))
            run = functools.partial(step, q, k, v, grad, backend, gqa)
            ms = time_ms(run, iters)
            print(f"  {tag}  {ms:7.2f} ms  {flops / ms / 1e9:6.0f} TFLOP/s  max diff {diff:.2e}")
            if label == "default" and gqa:
                for kernel in kernels(run):
                    print(f"      kernel: {kernel}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8b,1b,8b_tp2")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    print(torch.__version__, torch.cuda.get_device_name(), "cuDNN", torch.backends.cudnn.version())
    for name in args.shapes.split(","):
        run_shape(name, SHAPES[name], args.iters)


if __name__ == "__main__":
    main()
