"""The in-place cross-entropy's Triton kernels on a GPU, at Llama 3's vocabulary: the loss and
the head's gradients of F.cross_entropy on the same bf16 logits, and one logits-sized tensor
fewer at the backward's peak."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchtitan.kernels.inplace_loss import IGNORE_INDEX, inplace_cross_entropy_sum

VOCAB, DIM, TOKENS = 128256, 256, 4096


def standard(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")


def run(loss_fn, h, w, labels):
    """-> (loss, h.grad, w.grad, peak bytes allocated above the inputs during the step)."""
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = loss_fn(F.linear(h, w), labels)
    (loss / TOKENS).backward()
    torch.cuda.synchronize()
    return loss.detach(), h.grad, w.grad, torch.cuda.max_memory_allocated() - base


def test_in_place_kernels_match_f_cross_entropy_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(2, TOKENS // 2, DIM, device="cuda", generator=g).bfloat16()
    w = (torch.randn(VOCAB, DIM, device="cuda", generator=g) * 0.2).bfloat16()
    labels = torch.randint(0, VOCAB, (2, TOKENS // 2), device="cuda", generator=g)
    labels[1, -100:] = IGNORE_INDEX
    want = run(standard, h, w, labels)
    got = run(inplace_cross_entropy_sum, h, w, labels)
    print(
        f"loss {want[0].item():.4f} / {got[0].item():.4f}; peak above inputs "
        f"{want[3] / 2**30:.3f} / {got[3] / 2**30:.3f} GiB"
    )
    assert got[0].item() == pytest.approx(want[0].item(), rel=1e-5)
    for a, b in zip(got[1:3], want[1:3]):  # one bf16 rounding of the logits' gradient apart
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=1e-4)
    logits_bytes = TOKENS * VOCAB * 2
    # F.cross_entropy of logits.float() also holds fp32 copies; in place holds the logits alone.
    assert got[3] < want[3] - logits_bytes
    assert got[3] < 1.2 * logits_bytes


def test_a_vocabulary_shard_on_gpu():
    """The kernels on one TP rank's columns (loss parallel): its label logits, and with the
    whole vocabulary's log-sum-exp the shard's slice of the whole gradient."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from torchtitan.kernels import cross_entropy_kernels as kernels

    g = torch.Generator(device="cuda").manual_seed(1)
    logits = (torch.randn(TOKENS, VOCAB, device="cuda", generator=g) * 2).bfloat16()
    labels = torch.randint(0, VOCAB, (TOKENS,), device="cuda", generator=g)
    labels[:64] = IGNORE_INDEX
    start, stop = VOCAB // 2, VOCAB
    lse, _ = kernels.forward(logits, labels, IGNORE_INDEX)
    shard = logits[:, start:stop].clone()
    _, picked = kernels.forward(shard, labels, IGNORE_INDEX, col_offset=start)
    inside = (labels >= start) & (labels < stop)
    want = logits.float().gather(1, labels.clamp(min=0)[:, None]).squeeze(1)
    assert torch.equal(picked, torch.where(inside, want, 0.0))
    scale = torch.full((), 1.0 / TOKENS, device="cuda")
    kernels.backward_in_place(shard, labels, lse, scale, IGNORE_INDEX, col_offset=start)
    whole = logits.clone()
    kernels.backward_in_place(whole, labels, lse, scale, IGNORE_INDEX)
    assert torch.equal(shard, whole[:, start:stop])
