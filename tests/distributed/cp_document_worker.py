"""Context parallelism for document masking (ranks from ``run_ranks``; gloo, fp32).

Every rank builds the same model and packed batch. Reference: the whole sequence on one rank.
Under CP each rank runs its snake-dealt 128-token chunks (``sequence_shard``), gathering keys and
values inside attention; the summed losses and the gradients, summed over the ranks, must equal
the reference's. Rank 0 prints ``CP_DOC_RESULT {json}`` with the deviations.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from torchtitan.models.common.masks import AttentionOptions
from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.parallel.context_parallel_documents import sequence_shard, shard_sequence

BATCH, SEQ = 2, 512  # 512 = 2 rounds of 2 ranks x 128-token chunks: the snake split


def packed_positions(g: torch.Generator) -> torch.Tensor:
    rows = []
    for _ in range(BATCH):
        row: list[int] = []
        while len(row) < SEQ:
            row += range(int(torch.randint(1, 200, (), generator=g)))
        rows.append(row[:SEQ])
    return torch.tensor(rows, dtype=torch.int32)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    cp = dist.get_world_size()
    mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))
    reset = sys.argv[1:] == ["--reset-positions"]
    options = AttentionOptions(mask="document", reset_positions=reset)
    torch.manual_seed(0)
    args = get_model_args("debugmodel", n_layers=2, max_seq_len=SEQ)
    model = Transformer(dataclasses.replace(args, attention=options))
    model.init_weights()
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(args.vocab_size, (BATCH, SEQ), generator=g)
    labels = torch.randint(args.vocab_size, (BATCH, SEQ), generator=g)
    positions = packed_positions(g)

    def summed_loss(tokens, targets, **kwargs):
        logits = model(tokens, positions=positions, **kwargs)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")

    summed_loss(inputs, labels).backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    ref_loss = summed_loss(inputs, labels).item()
    model.zero_grad()

    shard = sequence_shard(mesh, SEQ, "cpu")
    local = summed_loss(
        shard_sequence(inputs, shard), shard_sequence(labels, shard), sequence_shard=shard
    )
    local.backward()
    total = local.detach().clone()
    dist.all_reduce(total)
    grad_rel = 0.0
    for name, param in model.named_parameters():
        grad = param.grad.clone()
        dist.all_reduce(grad)
        error = (grad - reference[name]).norm() / reference[name].norm().clamp_min(1e-12)
        grad_rel = max(grad_rel, error.item())
    if dist.get_rank() == 0:
        result = {"loss_rel": abs(total.item() - ref_loss) / ref_loss, "grad_rel": grad_rel}
        print("CP_DOC_RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
