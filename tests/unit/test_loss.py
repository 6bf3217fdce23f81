"""The fused, chunked head + cross-entropy equals the plain one, in value and gradients."""

import pytest
import torch
import torch.nn.functional as F

from torchtitan.loss import IGNORE_INDEX, cross_entropy_sum, linear_cross_entropy_sum


def inputs(tokens=37, dim=16, vocab=53, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(2, tokens, dim, generator=g, dtype=dtype, requires_grad=True)
    w = (torch.randn(vocab, dim, generator=g, dtype=dtype) / dim**0.5).requires_grad_()
    labels = torch.randint(0, vocab, (2, tokens), generator=g)
    return h, w, labels


def plain(h, w, labels):
    return cross_entropy_sum(F.linear(h, w), labels)


@pytest.mark.parametrize("chunk", [1, 7, 74, 1000])
def test_matches_unfused_loss_and_grads_fp32(chunk):
    h, w, labels = inputs()
    ref = plain(h, w, labels)
    ref.backward()
    ref_gh, ref_gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    out = linear_cross_entropy_sum(h, w, labels, chunk)
    out.backward()
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(h.grad, ref_gh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad, ref_gw, rtol=1e-5, atol=1e-6)


def test_upstream_gradient_scales_both_grads():
    h, w, labels = inputs()
    (plain(h, w, labels) / 3.0).backward()
    ref_gh, ref_gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    (linear_cross_entropy_sum(h, w, labels, 10) / 3.0).backward()
    torch.testing.assert_close(h.grad, ref_gh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad, ref_gw, rtol=1e-5, atol=1e-6)


def test_ignored_labels_count_nothing():
    h, w, labels = inputs()
    labels[0, :5] = IGNORE_INDEX
    ref = plain(h, w, labels)
    ref.backward()
    ref_gh = h.grad.clone()
    h.grad = w.grad = None
    out = linear_cross_entropy_sum(h, w, labels, 8)
    out.backward()
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(h.grad, ref_gh, rtol=1e-5, atol=1e-6)
    assert h.grad[0, :5].abs().max() == 0


def test_no_grad_skips_gradients():
    h, w, labels = inputs()
    with torch.no_grad():
        out = linear_cross_entropy_sum(h, w, labels, 9)
    torch.testing.assert_close(out, plain(h, w, labels).detach(), rtol=1e-6, atol=0)


def test_no_grad_computes_only_the_loss(monkeypatch):
    """Validation: no gradients precomputed in the forward (the autograd function is not used)."""
    from torchtitan import loss

    monkeypatch.setattr(loss._LinearCrossEntropySum, "apply", None)
    h, w, labels = inputs()
    labels[1, :3] = IGNORE_INDEX
    with torch.no_grad():
        out = linear_cross_entropy_sum(h, w, labels, 5)
        ref = plain(h, w, labels)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=0)


def test_bf16_close_to_fp32():
    # bf16 inputs, fp32 softmax and fp32 weight-gradient accumulation: within bf16 rounding.
    h, w, labels = inputs(tokens=64, dim=32, vocab=200)
    ref = plain(h, w, labels)
    out = linear_cross_entropy_sum(h.bfloat16(), w.bfloat16(), labels, 16)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-2, atol=0)


def test_rejects_bad_chunk():
    h, w, labels = inputs()
    with pytest.raises(ValueError, match="chunk_tokens must be positive"):
        linear_cross_entropy_sum(h, w, labels, 0)


def test_rejects_a_dtensor_weight(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    h, w, labels = inputs()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        dtensor = distribute_tensor(w.detach(), init_device_mesh("cpu", (1,)))
        with pytest.raises(ValueError, match="pass its vocabulary shard"):
            linear_cross_entropy_sum(h, dtensor, labels, 4)
    finally:
        dist.destroy_process_group()


def test_chunked_loss_head_is_a_linear_that_can_return_the_loss():
    from torchtitan.loss import ChunkedLossHead, use_chunked_loss_head
    from torchtitan.models.llama3 import Transformer
    from torchtitan.models.llama3.args import MODEL_FLAVORS

    with torch.device("meta"):
        model = Transformer(MODEL_FLAVORS["debugmodel"])
    use_chunked_loss_head(model, 16)
    assert isinstance(model.output, ChunkedLossHead) and model.defer_head
    h, w, labels = inputs(dim=256, vocab=4096)
    head = ChunkedLossHead(256, 4096, bias=False)
    head.chunk_tokens = 16
    with torch.no_grad():
        head.weight.copy_(w)
    torch.testing.assert_close(head(h), F.linear(h, w))
    torch.testing.assert_close(head(h, labels), plain(h, w, labels), rtol=1e-6, atol=0)
