"""FSDP2's gradient copy-in through our Triton kernel on a GPU (experimental/grad_copy_in.py):
the same buffer, bit for bit, as FSDP's own for an 8B block's gradients at world sizes 1, 2, 4 and
8 and
for the output head's at 1, 2 and 4; and three FSDP2 training steps of the debug model on a
one-rank NCCL group give the same losses and weights, bit for bit, with either copy-in."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from tests.unit.test_hf import random_model
from torchtitan.experimental.grad_copy_in import FSDP_COPY_IN, copy_in, use_triton_grad_copy_in
from torchtitan.models.llama3 import get_model_args


@pytest.fixture(autouse=True)
def needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_the_kernel_lays_out_an_8b_blocks_gradients_as_fsdp_does(world):
    a = get_model_args("8B")
    dim, kv, hidden = a.dim, a.kv_heads * a.head_dim, a.ffn_hidden_dim
    shapes = [(dim, dim), (kv, dim), (kv, dim), (dim, dim), (hidden, dim), (dim, hidden)]
    shapes += [(hidden, dim), (dim,), (dim,)]
    grads = [torch.randn(s, device="cuda", dtype=torch.bfloat16) for s in shapes]
    numel = sum(g.numel() for g in grads)
    want = torch.full((numel,), float("nan"), device="cuda")
    got = torch.full((numel,), float("nan"), device="cuda")
    FSDP_COPY_IN(grads, want, world)
    copy_in(grads, got, world)
    assert torch.equal(got, want)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_the_kernel_takes_the_output_heads_gradient(world):
    """Llama 3's head, 128,256 x 4,096: 525 M gradients, 128,256 programs of 1,024 per rank at
    world 4, more than a grid's second dimension holds (65,535)."""
    grad = torch.randn(128256, 4096, device="cuda", dtype=torch.bfloat16)
    want = torch.full((grad.numel(),), float("nan"), device="cuda")
    got = torch.full((grad.numel(),), float("nan"), device="cuda")
    FSDP_COPY_IN([grad], want, world)
    copy_in([grad], got, world)
    assert torch.equal(got, want)


def train(triton: bool) -> tuple[list[float], list[torch.Tensor]]:
    use_triton_grad_copy_in(triton)
    try:
        args = get_model_args("debugmodel", max_seq_len=256)
        model = random_model(args).cuda()
        initial = [p.detach().cpu().clone() for p in model.parameters()]
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.layers.values():
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(0)
        losses = []
        for _ in range(3):
            tokens = torch.randint(0, args.vocab_size, (2, 257), generator=gen).cuda()
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1).float(), tokens[:, 1:].flatten()
            )
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        weights = [p.full_tensor().cpu() for p in model.parameters()]
        assert not any(torch.equal(a, b) for a, b in zip(weights, initial))  # all trained
        return losses, weights
    finally:
        use_triton_grad_copy_in(False)


def test_fsdp_trains_the_same_with_either_copy_in():
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29573")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        torch_losses, torch_weights = train(triton=False)
        triton_losses, triton_weights = train(triton=True)
    finally:
        dist.destroy_process_group()
    print(f"losses: torch {torch_losses}, triton {triton_losses}")
    assert triton_losses == torch_losses
    assert all(torch.equal(a, b) for a, b in zip(triton_weights, torch_weights))
