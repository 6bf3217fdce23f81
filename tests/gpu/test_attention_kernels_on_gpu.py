"""FlexAttention and varlen attention compute what the dense-mask SDPA of the CPU path computes,
causal and document-causal, forward and backward, in bf16 on CUDA (the CPU suite checks the
document semantics with dense SDPA; this ties the GPU kernels to it)."""

import pytest
import torch

from torchtitan.models.common.attention import attend
from torchtitan.models.common.masks import AttentionOptions, build_mask

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SEQ, HEADS, KV_HEADS, HEAD_DIM = 1024, 8, 2, 64


def _positions(batch: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(batch):
        row: list[int] = []
        while len(row) < SEQ:
            row += range(int(torch.randint(1, 400, (), generator=g)))
        rows.append(row[:SEQ])
    return torch.tensor(rows, dtype=torch.int32, device="cuda")


def _run(kernel: str, mask: str, positions, q, k, v):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = attend(q, k, v, build_mask(AttentionOptions(kernel, mask), positions))
    out.float().square().sum().backward()
    return out.float(), [t.grad.float() for t in (q, k, v)]


@pytest.mark.parametrize("kernel", ["flex", "varlen"])
@pytest.mark.parametrize("mask", ["causal", "document"])
def test_kernel_matches_dense_sdpa(kernel, mask):
    torch.manual_seed(0)
    shape = (2, SEQ)
    q = torch.randn(*shape, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(*shape, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(*shape, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    positions = _positions()
    dense_positions = positions if mask == "document" else torch.zeros_like(positions)
    if mask == "causal":
        dense_positions[:, 1:] = 1  # one document per row: the dense mask is plain causal
    expected, expected_grads = _run("sdpa", "document", dense_positions, q, k, v)
    got, grads = _run(kernel, mask, positions, q, k, v)
    assert (got - expected).abs().max() < 2e-2
    for g, e in zip(grads, expected_grads, strict=True):
        assert (g - e).norm() / e.norm() < 2e-2
