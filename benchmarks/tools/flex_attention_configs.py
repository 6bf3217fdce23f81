"""Time FlexAttention forward + backward under our document-causal masks, kernel choice by choice.

    python benchmarks/tools/flex_attention_configs.py [--join 4] [--steps 11-20] [--iters 10]
        [--autotune] [--kernel-options '{"BLOCK_M": 128, ...}' ...]

Takes the packed batches of the bundled corpus for the chosen steps (our loader, documents joined
``--join`` at a time, as ``benchmarks/rows.toml``'s document rows train them), builds the block
mask of each and times flex_attention forward + backward at the Llama 3.2 1B attention shape
(batch 2, 32 query heads, 8 K/V heads, seq 8192, head dim 64, bf16) with CUDA events:

* ``default``: ``torch.compile(flex_attention)``, inductor's default kernel configuration (what
  a compiled transformer block runs);
* ``gathered q``: the same mask with its queries looked up through an index, as under context
  parallelism (the mask function's extra load per query row);
* ``autotune`` (``--autotune``): compiled with ``max_autotune``, as the reference framework
  compiles it; inductor prints the configurations it tried and the one it chose;
* each ``--kernel-options`` JSON: that explicit configuration;
* ``flex causal`` and ``sdpa causal`` (flash): the causal cost, for scale.

It prints the median milliseconds, the attention blocks each step computes and the
microseconds per 1,000 computed blocks, so that batches of different densities compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_backends import SHAPES, inputs, time_ms  # noqa: E402
from document_mask_density import computed_blocks, our_batches  # noqa: E402

from torchtitan.models.common.masks import (  # noqa: E402
    causal_block_mask,
    document_block_mask,
    document_ids,
)

SHAPE = SHAPES["1b"]  # batch, query heads, K/V heads, sequence, head dim


def warm_then_time_ms(fn, iters: int) -> float:
    fn()  # compile / autotune outside the timing
    return time_ms(fn, iters)


def flex_step(flex, q, k, v, grad, masks, kernel_options=None):
    def run():
        for mask in masks:
            for t in (q, k, v):
                t.grad = None
            out = flex(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=kernel_options)
            out.backward(grad)

    return run


def sdpa_step(q, k, v, grad, n):
    def run():
        for _ in range(n):
            for t in (q, k, v):
                t.grad = None
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(grad)

    return run


def report(label: str, ms: float, blocks: int, n: int) -> None:
    per = ms * 1000 / (blocks / 1000)
    line = f"{ms / n:8.2f} ms/batch  {blocks / n:9,.0f} blocks  {per:7.1f} us/1k blocks"
    print(f"  {label:34s} {line}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--join", type=int, default=4, help="our --training.join_documents")
    ap.add_argument("--steps", default="11-20", help="the training steps whose batches to time")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--autotune", action="store_true", help="also time a max_autotune compile")
    ap.add_argument("--kernel-options", action="append", default=[], metavar="JSON")
    args = ap.parse_args()
    from torch.nn.attention.flex_attention import flex_attention

    lo, hi = map(int, args.steps.split("-"))
    b, _, _, s, _ = SHAPE
    positions = [p.cuda() for p in our_batches(s, b, hi, args.join)[lo - 1 : hi]]
    n = len(positions)
    blocks = sum(computed_blocks(p.cpu()) for p in positions)
    docs = sum(int((p == 0).sum()) for p in positions)
    print(torch.__version__, torch.cuda.get_device_name())
    print(f"steps {lo}-{hi}, join {args.join}: mean document {b * s * n / docs:,.0f} tokens")
    masks = [document_block_mask(document_ids(p)) for p in positions]
    index = torch.arange(s, device="cuda")
    gathered = [document_block_mask(document_ids(p), index) for p in positions]
    causal = [causal_block_mask(s, "cuda")] * n
    causal_blocks = (s // 128) * (s // 128 + 1) // 2 * b * n
    q, k, v, grad = inputs(SHAPE, "cuda")
    flex = torch.compile(flex_attention)
    runs = [("default", flex, masks, None, blocks), ("gathered q", flex, gathered, None, blocks)]
    for options in args.kernel_options:
        runs.append((f"kernel_options {options}", flex, masks, json.loads(options), blocks))
    if args.autotune:
        tuned = torch.compile(
            flex_attention, options={"max_autotune": True, "coordinate_descent_tuning": True}
        )
        runs.append(("autotune", tuned, masks, None, blocks))
    runs.append(("flex causal", flex, causal, None, causal_blocks))
    for label, fn, chosen, options, count in runs:
        try:
            ms = warm_then_time_ms(flex_step(fn, q, k, v, grad, chosen, options), args.iters)
        except Exception as err:  # a configuration the kernel refuses
            print(f"  {label:34s} failed: {str(err).splitlines()[0][:120]}")
            continue
        report(label, ms, count, n)
    ms = warm_then_time_ms(sdpa_step(q, k, v, grad, n), args.iters)
    report("sdpa causal (flash)", ms, causal_blocks, n)


if __name__ == "__main__":
    main()
