"""FSDP2's reduce-scatter copy-in through our Triton kernel
(torchtitan/experimental/grad_copy_in.py): the same buffer, bit for bit, as FSDP's own
``foreach_reduce_scatter_copy_in`` (torch's
``_chunk_cat``), for bf16 -> float32 (the training case), float32 -> float32, bf16 -> bf16 and
float32 -> bf16 (a rounding cast, left to FSDP's own function), world sizes 1,
2 and 4, and gradients of 1 to 3 dimensions; FSDP's own for what the kernel does not take; and
the switch that routes FSDP to it and back. The kernel runs under Triton's CPU interpreter here;
tests/gpu/test_grad_copy_in_on_gpu.py runs it on a GPU."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.distributed.fsdp._fully_shard import _fsdp_collectives

from tests.unit.triton_interpreter import run_under_interpreter
from torchtitan.experimental import grad_copy_in

CHECK = """
import torch
from torchtitan.experimental.grad_copy_in import FSDP_COPY_IN, copy_in

gen = torch.Generator().manual_seed(0)
shapes = [(8, 6), (4, 6), (12,), (16, 3, 2)]
for world in (1, 2, 4):
    for grad_dtype, reduce_dtype in [
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.bfloat16),
    ]:
        grads = [torch.randn(s, generator=gen).to(grad_dtype) for s in shapes]
        numel = sum(g.numel() for g in grads)
        want = torch.full((numel,), float("nan"), dtype=reduce_dtype)
        got = torch.full((numel,), float("nan"), dtype=reduce_dtype)
        FSDP_COPY_IN(grads, want, world)
        copy_in(grads, got, world)
        assert torch.equal(got, want), (world, grad_dtype, reduce_dtype)
print("copy-in ok")
"""


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton's CPU interpreter (on a GPU: tests/gpu/test_grad_copy_in_on_gpu.py)",
)
def test_the_kernel_lays_out_fsdps_buffer_under_the_interpreter():
    assert "copy-in ok" in run_under_interpreter(CHECK)


def test_what_the_kernel_does_not_take_goes_to_fsdps_copy_in():
    """On CPU without the interpreter, and for a dim 0 FSDP pads (6 rows over 4 ranks): FSDP's
    own function, which pads each chunk."""
    grads = [torch.randn(6, 5), torch.randn(4, 5)]
    assert not grad_copy_in.handled(grads, torch.empty(0, device="meta"), 4)
    want, got = torch.zeros(8 * 5 + 4 * 5), torch.ones(8 * 5 + 4 * 5)
    grad_copy_in.FSDP_COPY_IN(grads, want, 4)
    grad_copy_in.copy_in(grads, got, 4)
    assert torch.equal(got, want)


def test_only_exact_casts_go_to_the_kernel(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # what makes CPU tensors the kernel's
    bf16, fp32 = torch.zeros(4, 2, dtype=torch.bfloat16), torch.zeros(4, 2)
    assert grad_copy_in.handled([bf16], torch.empty(8), 4)  # widening: exact
    assert grad_copy_in.handled([bf16], torch.empty(8, dtype=torch.bfloat16), 4)
    assert not grad_copy_in.handled([fp32], torch.empty(8, dtype=torch.bfloat16), 4)  # rounds
    assert not grad_copy_in.handled([bf16, torch.zeros(6, 2)], torch.empty(20), 4)  # padded
    float64 = torch.zeros(4, 2, dtype=torch.float64)
    assert not grad_copy_in.handled([float64], torch.empty(8), 4)  # narrows into float32


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_the_grid_puts_the_long_dimension_first():
    """The 8B head's 525 M gradients over 4 ranks: 128,256 blocks of 1,024 per rank, more than a
    CUDA grid's second dimension takes (65,535); they go along the first."""
    from torchtitan.experimental.grad_copy_in_kernel import grid

    assert grid(128256 * 4096 // 4, 4, 1024) == (128256, 4)
    with pytest.raises(ValueError, match="exceed a CUDA grid"):
        grid(16, 70000, 1024)


def test_the_switch_routes_fsdp_to_the_kernel_and_back():
    assert grad_copy_in.fsdp_copy_in_problem() is None  # this torch's private function as expected
    try:
        assert grad_copy_in.use_triton_grad_copy_in(True)
        assert _fsdp_collectives.foreach_reduce_scatter_copy_in is grad_copy_in.copy_in
    finally:
        assert not grad_copy_in.use_triton_grad_copy_in(False)
    assert _fsdp_collectives.foreach_reduce_scatter_copy_in is grad_copy_in.FSDP_COPY_IN
