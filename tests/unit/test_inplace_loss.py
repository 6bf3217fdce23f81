"""The in-place cross-entropy: the same loss and gradients as F.cross_entropy, the gradient
written into the logits' own storage, and loud failures where that would be unsafe. The Triton
kernels themselves run here under Triton's CPU interpreter when triton is installed (the
triton-interpreter extra, CPU machines), and on a GPU in tests/gpu/test_inplace_loss_on_gpu.py."""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from tests.unit.triton_interpreter import run_under_interpreter
from torchtitan.config import parse_args
from torchtitan.kernels.inplace_loss import (
    IGNORE_INDEX,
    in_place_chosen,
    in_place_problem,
    inplace_cross_entropy_sum,
)
from torchtitan.models.llama3.args import model_args_from_config
from torchtitan.parallel.checks import check_parallelism


def head_and_labels(dtype, tokens=(3, 700), dim=16, vocab=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*tokens, dim, generator=g).to(dtype)
    w = (torch.randn(vocab, dim, generator=g) * 0.5).to(dtype)
    labels = torch.randint(0, vocab, tokens, generator=g)
    labels[0, :37] = IGNORE_INDEX
    return h, w, labels


def loss_and_grads(loss_fn, h, w, labels, scale=0.37):
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = loss_fn(F.linear(h, w), labels)
    (loss * scale).backward()
    return loss.detach(), h.grad, w.grad


def reference(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_loss_and_gradients_as_f_cross_entropy(dtype):
    """fp32: to fp32 rounding. bf16: both compute in fp32 from the same bf16 logits and round
    the logits' gradient to bf16 once, so they may differ by one bf16 rounding of that gradient
    (2^-8 relative), which the head's matmuls carry into h's and w's gradients."""
    h, w, labels = head_and_labels(dtype)
    want = loss_and_grads(reference, h, w, labels)
    got = loss_and_grads(inplace_cross_entropy_sum, h, w, labels)
    assert got[0].dtype == torch.float32
    assert got[0].item() == pytest.approx(want[0].item(), rel=1e-6)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-3)
    for a, b in zip(got[1:], want[1:]):
        torch.testing.assert_close(a.float(), b.float(), **tol)


def test_the_gradient_is_written_into_the_logits_storage():
    h, w, labels = head_and_labels(torch.float32)
    w.requires_grad_()
    logits = F.linear(h, w)
    storage = logits.data_ptr()
    seen = []
    logits.register_hook(lambda grad: seen.append(grad.data_ptr()))
    inplace_cross_entropy_sum(logits, labels).backward()
    assert seen == [storage]
    # The ignored positions get no gradient: their rows of the logits are now zeros.
    assert logits[0, :37].abs().max().item() == 0.0


def test_strided_logits_and_labels():
    """Every other position of the sequence: the logits cannot be viewed as rows (reshape
    copies them) and the labels are strided; loss and gradients still match."""
    h, w, labels = head_and_labels(torch.float32)
    wants, gots = [], []
    for loss_fn, out in ((reference, wants), (inplace_cross_entropy_sum, gots)):
        w_ = w.clone().requires_grad_()
        full = F.linear(h, w_)
        loss = loss_fn(full[:, ::2], labels[:, ::2])
        loss.backward()
        out.extend([loss.detach(), w_.grad])
    torch.testing.assert_close(gots, wants, rtol=1e-5, atol=1e-6)


def test_without_gradients_the_logits_are_left_alone():
    h, w, labels = head_and_labels(torch.float32)
    logits = F.linear(h, w)
    before = logits.clone()
    with torch.no_grad():
        loss = inplace_cross_entropy_sum(logits, labels)
    assert loss.item() == pytest.approx(reference(before, labels).item(), rel=1e-6)
    assert torch.equal(logits, before)


def test_a_second_backward_is_refused():
    h, w, labels = head_and_labels(torch.float32)
    loss = inplace_cross_entropy_sum(F.linear(h, w.requires_grad_()), labels)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="ran twice"):
        loss.backward()


def test_another_node_that_saved_the_logits_fails_loudly():
    """A node built before the loss runs its backward after it: it finds the logits
    overwritten and autograd's in-place check raises, instead of using the gradient's values."""
    h, w, labels = head_and_labels(torch.float32)
    logits = F.linear(h, w.requires_grad_())
    squares = (logits * logits).sum()  # mul saves the logits
    total = squares + inplace_cross_entropy_sum(logits, labels)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        total.backward()


def test_which_loss_runs_and_what_is_refused(monkeypatch):
    assert in_place_chosen("auto", cuda=True)
    assert not in_place_chosen("auto", cuda=False)
    assert in_place_chosen("in_place", cuda=False)
    assert not in_place_chosen("standard", cuda=True)
    assert in_place_problem("in_place", cuda=False) is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert "needs Triton" in in_place_problem("in_place", cuda=True)
    assert in_place_problem("auto", cuda=True) is None
    assert not in_place_chosen("auto", cuda=True)  # auto falls back to the standard loss


KERNEL_CHECK = r"""
import torch
from torchtitan.kernels import cross_entropy_kernels as k
from torchtitan.kernels.inplace_loss import IGNORE_INDEX, inplace_cross_entropy_sum
torch.manual_seed(0)
rows = torch.arange(48)
for vocab, block in ((1000, 256), (300, 512)):  # several blocks with a ragged last one; one
    logits = (torch.randn(48, vocab + 5) * 4)[:, :vocab]  # rows strided wider than the vocab
    labels = torch.randint(0, vocab, (48,))
    labels[:5] = IGNORE_INDEX
    lse, picked = k.forward(logits, labels, IGNORE_INDEX, block=block, warps=4)
    torch.testing.assert_close(lse, torch.logsumexp(logits, -1), rtol=1e-5, atol=1e-5)
    want = torch.where(labels >= 0, logits[rows, labels.clamp(min=0)], 0.0)
    torch.testing.assert_close(picked, want, rtol=0, atol=0)
    expected = torch.softmax(logits, -1) * 0.25
    expected[rows, labels.clamp(min=0)] -= 0.25
    expected[:5] = 0
    grad = logits.clone()
    k.backward_in_place(grad, labels, lse, torch.tensor(0.25), IGNORE_INDEX, block=block, warps=4)
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)
    # A vocabulary shard, columns [130, 290): its own lse, the labels among its columns, and
    # with the whole vocabulary's lse the shard's slice of the whole gradient.
    shard = logits[:, 130:290]
    lse_s, picked_s = k.forward(shard, labels, IGNORE_INDEX, col_offset=130, block=block, warps=4)
    torch.testing.assert_close(lse_s, torch.logsumexp(shard, -1), rtol=1e-5, atol=1e-5)
    inside = (labels >= 130) & (labels < 290)
    torch.testing.assert_close(picked_s, torch.where(inside, want, 0.0), rtol=0, atol=0)
    grad = shard.clone()
    k.backward_in_place(grad, labels, lse, torch.tensor(0.25), IGNORE_INDEX, 130, block, 4)
    torch.testing.assert_close(grad, expected[:, 130:290], rtol=1e-5, atol=1e-6)
# Through the autograd function, with the default block sizes (one partial block per row).
x = torch.randn(2, 24, 700, requires_grad=True)
y = torch.randint(0, 700, (2, 24))
a = x.detach().clone().requires_grad_()
inplace_cross_entropy_sum(x * 1, y).backward()
torch.nn.functional.cross_entropy(a.flatten(0, 1), y.flatten(), reduction="sum").backward()
torch.testing.assert_close(x.grad, a.grad, rtol=1e-5, atol=1e-6)
print("kernels ok")
"""


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton not installed (the triton-interpreter extra)",
)
@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a GPU runs the kernels themselves (tests/gpu/test_inplace_loss_on_gpu.py); the "
    "interpreter of the Triton that CUDA torch pins may not run under this numpy",
)
def test_the_triton_kernels_under_the_interpreter():
    assert "kernels ok" in run_under_interpreter(KERNEL_CHECK)


def test_preflight_takes_in_place_under_loss_parallel():
    cfg = parse_args(["--parallelism.tensor_parallel_degree=2", "--training.logits_loss=in_place"])
    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    assert check_parallelism(cfg, args, world_size=2).tp == 2
