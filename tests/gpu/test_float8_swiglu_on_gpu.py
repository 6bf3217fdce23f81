"""The fused float8 SwiGLU backward on a GPU (torchtitan/experimental/float8_swiglu.py): its Triton
kernels against the same operators' torch path (eager's own ops) on the same inputs, and a
compiled float8 block with the fused feed-forward against the unfused one.

The kernels compute ``exp`` with Triton's fast exponential where torch's CUDA ops use ``expf``,
so a gradient can round to the neighbouring bf16 value, and then to the neighbouring float8
value: the test counts those and bounds them, and everything else is compared bit for bit."""

from __future__ import annotations

import copy
import unittest.mock

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs a CUDA device with float8 (compute capability 8.9+)",
)

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def swiglu_inputs(tokens: int, hidden: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(std):
        return (torch.randn(tokens, hidden, device="cuda", generator=g) * std).bfloat16()

    return randn(1e-4), randn(2.0), randn(1.5)


def neighbours_or_equal(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(the share of elements whose float8 values differ, the largest relative difference among
    those): one float8 step is at most 1/4 of the value in e5m2, 1/8 in e4m3."""
    a, b = a.float(), b.float()
    differ = a != b
    relative = (a - b).abs() / torch.maximum(a.abs(), b.abs())
    worst = relative[differ].max().item() if differ.any() else 0.0
    return differ.float().mean().item(), worst


@pytest.mark.parametrize("shape", [(4096, 8192), (1000, 3000)], ids=["aligned", "ragged"])
@pytest.mark.parametrize("power_of_2", [False, True], ids=["exact", "pow2"])
def test_kernels_match_the_torch_path(shape, power_of_2):
    from torchtitan.experimental.float8_swiglu import (
        _kernel_module,
        swiglu_float8_grad_amax,
        swiglu_float8_grad_cast,
        swiglu_grads_in_torch,
    )

    dh, a1, a3 = swiglu_inputs(*shape)
    assert _kernel_module(dh, a1, a3) is not None  # the operators below run the Triton kernels
    da1, da3, _ = swiglu_grads_in_torch(dh, a1, a3)
    want_amax = torch.stack([da1.abs().max(), da3.abs().max()]).float()
    got_amax = swiglu_float8_grad_amax(dh, a1, a3)  # the operator dispatches to the kernel
    torch.testing.assert_close(got_amax, want_amax, rtol=2**-7, atol=0)
    h_scale = torch.tensor(17.0, device="cuda")
    args = (got_amax, h_scale, E5M2, E4M3, power_of_2)
    got = swiglu_float8_grad_cast(dh, a1, a3, *args)
    with unittest.mock.patch(
        "torchtitan.experimental.float8_swiglu._kernel_module", lambda *tensors: None
    ):  # the torch path on the same GPU, from the same amaxes
        want = swiglu_float8_grad_cast(dh, a1, a3, *args)
    names = ["da1", "da1_t", "da3", "da3_t", "h_t"]
    for name, w, g in zip(names, want[:5], got[:5]):
        assert g.shape == w.shape and g.dtype == w.dtype and g.is_contiguous(), name
        share, worst = neighbours_or_equal(w, g)
        assert share < 1e-3 and worst <= 0.25, (name, share, worst)
    assert torch.equal(got[5], want[5])
    for row_major, transposed in ((got[0], got[1]), (got[2], got[3])):  # exact transposes
        assert torch.equal(
            transposed.view(torch.uint8), row_major.t().contiguous().view(torch.uint8)
        )


def three_blocks():
    """Block 0 of the 1B model in bf16 (FSDP's compute dtype), and copies of it with float8
    linears as the trainer converts them, the feed-forward unfused and fused."""
    from torchtitan.config import Float8
    from torchtitan.experimental.float8_swiglu import fuse_swiglu
    from torchtitan.float8.convert import apply_float8
    from torchtitan.models.llama3 import get_model_args
    from torchtitan.models.llama3 import model as llama
    from torchtitan.models.llama3.parallelize import LLAMA3

    torch.manual_seed(0)
    args = get_model_args("1B", n_layers=1, max_seq_len=2048)
    with torch.device("cuda"):
        bf16 = llama.TransformerBlock(0, args)
        bf16.init_weights()
    bf16 = bf16.bfloat16()
    unfused = copy.deepcopy(bf16)
    apply_float8(unfused, Float8(enable=True), tiled_cast=LLAMA3.float8_tiled_cast)
    fused = copy.deepcopy(unfused)
    assert fuse_swiglu(fused.feed_forward)
    return (bf16, unfused, fused), args


def compiled_step(block, args) -> list[torch.Tensor]:
    from torchtitan.models.llama3 import model as llama

    torch._dynamo.reset()
    rope = llama.precompute_rope_cache(args.head_dim, 2048, args.rope_theta).cuda()
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(2, 2048, args.dim, device="cuda", generator=g).bfloat16().requires_grad_()
    out = torch.compile(block, fullgraph=True)(x, rope)
    out.backward(torch.randn(out.shape, device="cuda", generator=g).bfloat16())
    return [out, x.grad] + [p.grad for p in block.parameters()]


def test_compiled_block_with_the_fused_feed_forward_is_as_close_to_bf16_as_the_unfused():
    """Float8 moves each output and gradient away from the bf16 block's by its rounding; the
    fused feed-forward rounds differently here and there (eager's bf16 roundings in its kernels,
    none inside inductor's fused ones), so it must be no further from bf16 than the unfused
    one, give or take a quarter (a wrong scale or layout would be ~100 % off)."""
    (bf16, unfused, fused), args = three_blocks()
    reference = compiled_step(bf16, args)
    ours = {"unfused": compiled_step(unfused, args), "fused": compiled_step(fused, args)}
    names = ["out", "x.grad"] + [name for name, _ in bf16.named_parameters()]
    for i, name in enumerate(names):
        errors = {
            kind: ((got[i].float() - reference[i].float()).norm() / reference[i].float().norm())
            for kind, got in ours.items()
        }
        print(f"{name}: relative error unfused {errors['unfused']:.4f} fused {errors['fused']:.4f}")
        assert errors["fused"] <= 1.25 * errors["unfused"] + 0.005, name


def test_a_nan_gradient_gives_nan_amaxes_as_torch_does():
    """``tl.max`` skips NaN; the kernel keeps it, so a NaN scale spreads it as the unfused
    backward's ``torch.max`` does."""
    from torchtitan.experimental.float8_swiglu import swiglu_float8_grad_amax

    dh, a1, a3 = swiglu_inputs(1024, 1024)
    dh[5, 7] = float("nan")
    assert swiglu_float8_grad_amax(dh, a1, a3).isnan().all()
    dh[5, 7] = float("inf")
    a1[0, 0] = float("inf")  # silu_backward at inf: inf * 0, NaN in eager too
    got = swiglu_float8_grad_amax(dh, a1, a3)
    assert got[0].isnan() and got[1].isinf()
