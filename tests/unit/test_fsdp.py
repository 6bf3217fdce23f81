"""FSDP2 wiring (torchtitan/parallel/fsdp.py) under bf16 mixed precision, on a one-rank gloo mesh:
what each sharded block receives."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

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
