"""Time the loss of whole logits, forward and backward, at the benchmark rows' shapes.

    python benchmarks/tools/cross_entropy.py [--tokens 32768] [--vocab 128256] [--iters 20]

Runs on one GPU with bf16 logits (tokens x vocab) and prints, per way of computing the summed
cross-entropy and its gradient: the median milliseconds of the forward and of the backward (CUDA
events), the memory traffic that works out to (forward: one read of the logits; backward: one
read and one write), and the peak memory the backward allocates above the logits. The ways: the
trainer's ``--compile.loss`` (torch.compile of F.cross_entropy of ``logits.float()``), and the
in-place Triton kernels (torchtitan/kernels/inplace_loss.py) at several block sizes and warp counts.
"""

from __future__ import annotations

import argparse

import torch
from cuda_timing import median_ms, peak_gib

from torchtitan.kernels import cross_entropy_kernels as kernels
from torchtitan.kernels.inplace_loss import IGNORE_INDEX
from torchtitan.loss import cross_entropy_sum

CONFIGS = [(4096, 8), (8192, 8), (8192, 16), (16384, 16), (32768, 32)]


def compiled_standard(logits, labels, iters):
    loss_fn = torch.compile(cross_entropy_sum)
    leaf = logits.detach().requires_grad_()
    state = {}

    def forward():
        state["loss"] = loss_fn(leaf[None], labels[None])

    def backward():
        forward()  # the graph is consumed by each backward
        torch.autograd.grad(state["loss"], leaf)

    forward_ms = median_ms(forward, iters, warmup=3)
    both_ms = median_ms(backward, iters, warmup=3)
    forward()
    peak = peak_gib(lambda: torch.autograd.grad(state["loss"], leaf))
    return forward_ms, both_ms - forward_ms, peak


def in_place(logits, labels, iters, block, warps):
    grad = torch.full((), 1.0 / logits.shape[0], device=logits.device)
    state = {}

    def forward():
        state["lse"], _ = kernels.forward(logits, labels, IGNORE_INDEX, block, warps)

    def backward():
        kernels.backward_in_place(logits, labels, state["lse"], grad, IGNORE_INDEX, block, warps)

    forward()
    forward_ms = median_ms(forward, iters, warmup=3)
    backward_ms = median_ms(backward, iters, warmup=3)
    return forward_ms, backward_ms, peak_gib(backward)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    logits = (torch.randn(args.tokens, args.vocab, device="cuda") * 2).bfloat16()
    labels = torch.randint(0, args.vocab, (args.tokens,), device="cuda")
    nbytes = logits.numel() * logits.element_size()
    print(
        f"{torch.cuda.get_device_name()}; logits {args.tokens} x {args.vocab} bf16, "
        f"{nbytes / 2**30:.2f} GiB"
    )

    def report(name, forward_ms, backward_ms, peak):
        print(
            f"{name:34s} forward {forward_ms:6.2f} ms ({nbytes / forward_ms / 1e6:5.0f} GB/s)  "
            f"backward {backward_ms:6.2f} ms ({2 * nbytes / backward_ms / 1e6:5.0f} GB/s)  "
            f"total {forward_ms + backward_ms:6.2f} ms  backward peak +{peak:.2f} GiB"
        )

    report("compiled F.cross_entropy", *compiled_standard(logits, labels, args.iters))
    for block, warps in CONFIGS:
        report(
            f"in place, block {block}, {warps} warps",
            *in_place(logits, labels, args.iters, block, warps),
        )


if __name__ == "__main__":
    main()
