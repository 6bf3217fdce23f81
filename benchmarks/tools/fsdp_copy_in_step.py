"""One GPU: a stack of Llama blocks under FSDP2 on a one-rank NCCL group (bf16 compute, float32
gradient reduction, as the 8B rows run), forward + backward, with FSDP's gradient copy-in by
torch's ``chunk_cat`` and by our Triton kernel (torchtitan/experimental/grad_copy_in.py) in turns,
A B B A ..., in one process: the switch is a module global FSDP reads at every reduce-scatter.

    python benchmarks/tools/fsdp_copy_in_step.py --flavor 8B --blocks 4 --seq 8192

With one rank the reduce-scatter itself is a copy on FSDP's reduce-scatter stream, but the
copy-in runs on the compute stream as on 4 GPUs. Prints the median milliseconds of each.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from torchtitan.experimental.grad_copy_in import use_triton_grad_copy_in
from torchtitan.models.llama3 import get_model_args
from torchtitan.models.llama3.model import TransformerBlock, precompute_rope_cache


class Stack(nn.Module):
    def __init__(self, args, blocks: int):
        super().__init__()
        self.layers = nn.ModuleList(TransformerBlock(i, args) for i in range(blocks))
        rope = precompute_rope_cache(args.head_dim, args.max_seq_len, args.rope_theta)
        self.register_buffer("rope", rope, persistent=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h = layer(h, self.rope)
        return h


def step_ms(model: nn.Module, x: torch.Tensor) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    model(x).float().pow(2).mean().backward()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", default="8B")
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29571")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    args = get_model_args(a.flavor, max_seq_len=a.seq)
    with torch.device("cuda"):
        model = Stack(args, a.blocks)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        if a.compile:
            layer.compile()
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    x = torch.randn(1, a.seq, args.dim, device="cuda", requires_grad=True)
    times: dict[str, list[float]] = {"torch": [], "triton": []}
    for _ in range(3):  # warm-up (and compile) with both
        for name in times:
            use_triton_grad_copy_in(name == "triton")
            step_ms(model, x)
    for r in range(a.rounds):
        for name in ("torch", "triton") if r % 2 == 0 else ("triton", "torch"):
            use_triton_grad_copy_in(name == "triton")
            times[name].append(step_ms(model, x))
    print(
        f"{torch.cuda.get_device_name()}; {a.blocks} {a.flavor} blocks, seq {a.seq}, "
        f"compile {a.compile}"
    )
    for name, ms in times.items():
        print(
            f"copy-in {name:<7} median {statistics.median(ms):8.2f} ms  "
            f"(min {min(ms):.2f}, max {max(ms):.2f})"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
