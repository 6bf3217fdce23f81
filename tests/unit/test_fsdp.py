"""FSDP2 wiring (torchtitan/parallel/fsdp.py) on a one-rank gloo mesh: what each sharded block
receives under bf16 mixed precision, and which embeddings are row-sharded."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from torchtitan.experimental.sharded_embedding import RowShardedEmbedding, shard_embedding_rows
from torchtitan.models.llama3 import ModelArgs, Transformer
from torchtitan.parallel.fsdp import apply_fsdp


def test_blocks_get_bf16_activations_and_the_float32_rope_cache(tmp_path):
    """The root casts the model's inputs; the blocks' own arguments are left alone, so the RoPE
    cache stays float32 (its cos/sin not rounded to bf16, no bf16 copy per block held for
    backward) while the activations arrive in bf16 from the embeddings and the block before."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        args = ModelArgs(dim=64, n_layers=2, n_heads=4, vocab_size=128, max_seq_len=32)
        model = Transformer(args)
        apply_fsdp(model, init_device_mesh("cpu", (1,)), param_dtype=torch.bfloat16)
        seen = []
        for block in model.layers.values():
            block.register_forward_pre_hook(
                lambda module, inputs: seen.append([x.dtype for x in inputs])
            )
        model(torch.randint(args.vocab_size, (2, 16))).float().sum().backward()
        assert seen == [[torch.bfloat16, torch.float32]] * args.n_layers
    finally:
        dist.destroy_process_group()


def test_only_plain_embeddings_that_tp_left_whole_are_row_sharded(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        model = nn.Module()
        model.plain = nn.Embedding(10, 4)
        model.padded = nn.Embedding(10, 4, padding_idx=0)
        model.tp_sharded = nn.Embedding(10, 4)
        model.tp_sharded.weight = nn.Parameter(
            distribute_tensor(torch.randn(10, 4), mesh, [Shard(0)])
        )
        names = ("plain", "padded", "tp_sharded", "absent")
        ignored = shard_embedding_rows(model, names, mesh, torch.float32, torch.float32)
        assert isinstance(model.plain, RowShardedEmbedding)
        assert ignored == {model.plain.weight}
        assert type(model.padded) is nn.Embedding and type(model.tp_sharded) is nn.Embedding
        ids = torch.tensor([[1, 9, 3]])
        assert torch.equal(model.plain(ids), model.plain.weight.full_tensor()[ids])
    finally:
        dist.destroy_process_group()
