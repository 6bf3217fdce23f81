"""Measure the planner's per-block and loss terms on one CUDA GPU.

``python -m torchtitan.planning.measure SPEC ...`` with SPEC = FLAVOR:PRECISION:ATTENTION:MODES,
e.g. ``8B:bf16:gqa:all,alternate,none,full 1B:autocast:gqa:alternate,none,all``:

* PRECISION ``bf16``: bf16 weights and activations (FSDP's mixed precision); ``autocast``: fp32
  weights under bf16 autocast (one GPU without FSDP).
* ATTENTION ``gqa``: the model as it is; ``repeat``: K/V repeated to every head (the model before
  native GQA), to translate measurements taken before that change.
* MODES: activation checkpointing of the blocks: none, all / alternate (selective op with
  save_matmuls all / alternate), full.

For each mode it builds 4 blocks with the project's apply_ac + apply_compile and reports the
growth of ``torch.cuda.memory_allocated`` per block during forward at 4096 and 8192 tokens: the
slope is the saved KiB per token per block, the intercept per-block fixed bytes (e.g. autocast's
bf16 weight copies). ``ms`` is one block's forward + backward at 8192 tokens. With ``gqa`` it
also reports the final norm + head + eager loss: bytes per token per vocabulary entry held after
forward and at the backward peak. docs/planning.md lists the last results.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn as nn

import torchtitan.models.common.attention as common_attention
import torchtitan.models.llama3.model as llama
from torchtitan.loss import cross_entropy_sum
from torchtitan.models.llama3 import get_model_args
from torchtitan.parallel.activation_checkpoint import apply_ac
from torchtitan.parallel.compile import apply_compile

MODES = {
    "none": ("none", "all"),
    "all": ("selective", "all"),
    "alternate": ("selective", "alternate"),
    "full": ("full", "all"),
}
SEQS = (4096, 8192)
N_BLOCKS = 4


class Blocks(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.layers = nn.ModuleDict(
            {str(i): llama.TransformerBlock(i, args) for i in range(N_BLOCKS)}
        )


def _dtype(precision: str) -> torch.dtype:
    return torch.bfloat16 if precision == "bf16" else torch.float32


def _forward_backward(model: Blocks, args, seq: int, precision: str) -> list[int]:
    """One forward + backward; memory_allocated after each block's forward."""
    rope = llama.precompute_rope_cache(args.head_dim, seq).cuda()
    # bf16 under autocast too: the model casts the embedding's output to autocast's dtype.
    x = torch.randn(1, seq, args.dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    sizes = [torch.cuda.memory_allocated()]
    h = x
    with torch.autocast("cuda", torch.bfloat16, enabled=precision == "autocast"):
        for block in model.layers.values():
            h = block(h, rope)
            sizes.append(torch.cuda.memory_allocated())
    h.float().sum().backward()
    return sizes


def _growth(model: Blocks, args, seq: int, precision: str) -> float:
    _forward_backward(model, args, seq, precision)  # compile, warm up
    sizes = _forward_backward(model, args, seq, precision)
    steps = [b - a for a, b in zip(sizes[1:], sizes[2:])]  # block 0 also clones its input
    return sum(steps) / len(steps)


def measure_mode(args, mode: str, precision: str) -> dict:
    torch._dynamo.reset()
    model = Blocks(args)
    ac_mode, save = MODES[mode]
    apply_ac(model, ac_mode, "op", save_matmuls=save)
    apply_compile(model)
    model = model.to("cuda", _dtype(precision))
    short, long = (_growth(model, args, s, precision) for s in SEQS)
    per_token = (long - short) / (SEQS[1] - SEQS[0])
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        _forward_backward(model, args, SEQS[1], precision)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - start) / (3 * N_BLOCKS) * 1e3
    return {
        "kib": round(per_token / 1024, 2),
        "fixed_mib": round((long - per_token * SEQS[1]) / 2**20, 1),
        "ms": round(ms, 2),
    }


def measure_loss(args, precision: str, seq: int = SEQS[1]) -> dict:
    dtype = _dtype(precision)
    norm = llama.RMSNorm(args.dim).to("cuda", dtype)
    head = nn.Linear(args.dim, args.vocab_size, bias=False).to("cuda", dtype)
    h = torch.randn(1, seq, args.dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, args.vocab_size, (1, seq), device="cuda")
    result = {}
    for _ in range(2):  # the first pass warms up cuBLAS
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", torch.bfloat16, enabled=precision == "autocast"):
            logits = head(norm(h))
        loss = cross_entropy_sum(logits, labels)
        held = torch.cuda.memory_allocated() - base
        loss.backward()  # logits stay referenced, as in the trainer
        peak = torch.cuda.max_memory_allocated() - base
        per_vocab = seq * args.vocab_size
        result = {"held": round(held / per_vocab, 2), "peak": round(peak / per_vocab, 2)}
        del logits, loss
        h.grad = None
    return result


def main(specs: list[str]) -> None:
    native_gqa = common_attention.native_gqa
    for spec in specs:
        flavor, precision, attention, modes = spec.split(":")
        common_attention.native_gqa = native_gqa if attention == "gqa" else (lambda x: False)
        args = get_model_args(flavor, max_seq_len=SEQS[1])
        result = {"blocks": {m: measure_mode(args, m, precision) for m in modes.split(",")}}
        if attention == "gqa":
            result["loss"] = measure_loss(args, precision)
        print(json.dumps({spec: result}), flush=True)
    common_attention.native_gqa = native_gqa


if __name__ == "__main__":
    main(sys.argv[1:] or ["8B:bf16:gqa:all,alternate,none,full"])
