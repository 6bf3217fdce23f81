"""The fused float8 SwiGLU feed-forward (torchtitan/experimental/float8_swiglu.py, switched on by
``--experimental.float8_fused_swiglu``) on CPU, emulated: a block with it trains bit for bit like
the unfused block, eager and compiled; which feed-forwards get it and when the composition fuses
them; its operators pass torch's checks; its kernels' layout and scales under Triton's
interpreter; and what the compiled block keeps for the backward."""

from __future__ import annotations

import dataclasses
import importlib.util
import unittest.mock

import pytest
import torch

from tests.unit.test_float8_backward import llama_float8, saved_for_backward
from tests.unit.triton_interpreter import run_under_interpreter
from torchtitan.config import Float8, JobConfig
from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.models.llama3 import model as llama

EMULATED = Float8(enable=True, emulate=True)


def block(fused: bool, cfg: Float8 = EMULATED, **family):
    from torchtitan.experimental.float8_swiglu import use_fused_swiglu

    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(get_model_args("debugmodel", max_seq_len=64))
    llama_float8(model, cfg, **family)
    if fused:
        assert use_fused_swiglu(model) == len(model.layers)
    first = model.layers["0"].to_empty(device="cpu")
    first.init_weights()
    return first


def step(model, compiled: bool) -> list[torch.Tensor]:
    torch._dynamo.reset()
    args = get_model_args("debugmodel", max_seq_len=64)
    rope = llama.precompute_rope_cache(args.head_dim, 64, args.rope_theta)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 64, args.dim, generator=gen).bfloat16().requires_grad_()
    run = torch.compile(model, fullgraph=True) if compiled else model
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(x, rope)
    out.backward(torch.randn(out.shape, generator=gen).bfloat16())
    return [out, x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize(
    "compiled, tiled",
    [(False, None), (True, None), (False, [])],
    ids=["eager", "compiled", "eager, no tiled cast"],
)
def test_the_fused_block_computes_the_unfused_bits(compiled, tiled):
    """The torch path of the operators is eager autograd's own ops, so the outputs and every
    gradient are the unfused block's bit for bit (compiled: both rounding like eager), with the
    block input's transposed cast tiled (Llama's default) or not (no tiled-cast linears)."""
    family = {} if tiled is None else {"tiled_cast": tiled}
    with unittest.mock.patch("torch._inductor.config.emulate_precision_casts", True):
        want = step(block(fused=False, **family), compiled)
        got = step(block(fused=True, **family), compiled)
    names = ["out", "x.grad"] + [name for name, _ in block(False).named_parameters()]
    for name, w, g in zip(names, want, got):
        assert torch.equal(g, w), name


def switched_on(**float8) -> JobConfig:
    cfg = JobConfig()
    cfg.float8 = dataclasses.replace(EMULATED, **float8)
    cfg.experimental.float8_fused_swiglu = True
    return cfg


@pytest.mark.parametrize(
    "cfg, tp, problem",
    [
        (switched_on(), 1, None),
        (switched_on(), 2, "does not run under TP"),
        (switched_on(recipe="rowwise"), 1, "needs --float8.enable with recipe tensorwise"),
        (switched_on(enable=False), 1, "needs --float8.enable with recipe tensorwise"),
    ],
    ids=["tensorwise", "under TP", "rowwise", "float8 off"],
)
def test_the_switch_runs_with_tensorwise_float8_without_tp(cfg, tp, problem):
    from torchtitan.experimental import Where, experimental_problem

    where = Where(on_gpu=False, tp=tp, pp=1, fsdp_degree=1, data_parallel=False)
    got = experimental_problem(cfg, where, gpus_per_node=1)
    assert got == problem if problem is None else problem in got


def test_only_feed_forwards_of_three_float8_linears_of_ours_are_fused():
    from torchtitan.experimental.float8_swiglu import FusedFloat8SwiGLU, use_fused_swiglu

    fused = block(fused=True)
    assert isinstance(fused.feed_forward, FusedFloat8SwiGLU)
    assert isinstance(fused.feed_forward, llama.FeedForward)  # still the model's module
    with torch.device("meta"):
        model = Transformer(get_model_args("debugmodel", max_seq_len=64))
    llama_float8(model, dataclasses.replace(EMULATED, filter_fqns=["w2"]))
    assert use_fused_swiglu(model) == 0
    with torch.device("meta"):
        model = Transformer(get_model_args("debugmodel", max_seq_len=64))
    llama_float8(model, EMULATED)
    model.layers["0"].feed_forward.w2.own_backward = False  # torchao's function
    assert use_fused_swiglu(model) == len(model.layers) - 1


@pytest.mark.parametrize("switch", [False, True], ids=["default", "switched on"])
def test_the_composition_fuses_the_feed_forwards_only_when_switched_on(switch):
    from torchtitan.config import Parallelism
    from torchtitan.experimental.float8_swiglu import FusedFloat8SwiGLU
    from torchtitan.models.llama3.parallelize import LLAMA3
    from torchtitan.parallel.compose import parallelize
    from torchtitan.parallel.dims import ParallelDims

    cfg = switched_on()
    cfg.experimental.float8_fused_swiglu = switch
    assert not JobConfig().experimental.float8_fused_swiglu  # off by default
    with torch.device("meta"):
        model = Transformer(get_model_args("debugmodel", max_seq_len=64))
    parallelize(model, LLAMA3, ParallelDims.from_config(Parallelism(), 1), cfg, "cpu")
    fused = [isinstance(b.feed_forward, FusedFloat8SwiGLU) for b in model.layers.values()]
    assert fused == [switch] * len(model.layers)


def test_inputs_already_in_float8_run_the_unfused_forward(monkeypatch):
    """A float8 input (as torchao's float8 TP styles would hand it): the unfused forward (whose
    linears take it) runs, not the fused function."""
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic

    from torchtitan.experimental import float8_swiglu

    calls = []
    monkeypatch.setattr(
        float8_swiglu.Float8SwiGLU, "apply", lambda *args: calls.append(args) or args[0]
    )
    ffn = block(fused=True).feed_forward
    x = torch.randn(4, ffn.w1.in_features)
    ffn(x)
    assert len(calls) == 1
    ffn(hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, ffn.w1.linear_mm_config))
    assert len(calls) == 1


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_bf16_cuda_tensors_find_the_kernels():
    """Only bf16 CUDA tensors import the Triton kernels (by module name), so CPU runs would not
    see a name that no longer resolves; the GPU tests run the kernels."""
    from tests.unit.test_float8_backward import CudaBf16
    from torchtitan.experimental import float8_swiglu, float8_swiglu_kernel

    assert float8_swiglu._kernel_module(CudaBf16(), CudaBf16()) is float8_swiglu_kernel
    assert float8_swiglu._kernel_module(CudaBf16(), torch.ones(1).bfloat16()) is None


def test_the_operators_pass_torchs_checks():
    from torchtitan.experimental.float8_swiglu import (
        swiglu_float8_grad_amax,
        swiglu_float8_grad_cast,
    )

    gen = torch.Generator().manual_seed(0)
    dh, a1, a3 = (torch.randn(24, 40, generator=gen).bfloat16() for _ in range(3))
    torch.library.opcheck(swiglu_float8_grad_amax, (dh, a1, a3))
    amax = swiglu_float8_grad_amax(dh, a1, a3)
    args = (dh, a1, a3, amax, torch.tensor(3.0), torch.float8_e5m2, torch.float8_e4m3fn, False)
    torch.library.opcheck(swiglu_float8_grad_cast, args)


KERNELS_CHECK = """
import torch
from torchao.float8.float8_utils import amax_to_scale
from torchtitan.experimental import float8_swiglu_kernel as kernel
from torchtitan.experimental.float8_swiglu import swiglu_float8_grad_amax, swiglu_float8_grad_cast

gen = torch.Generator().manual_seed(0)
dh, a1, a3 = ((torch.randn(100, 72, generator=gen) * s).bfloat16() for s in (1e-3, 3.0, 2.0))
want_amax = swiglu_float8_grad_amax(dh, a1, a3)  # the torch path (CPU tensors)
amax = kernel.grad_amax(dh, a1, a3)
torch.testing.assert_close(amax, want_amax, rtol=2**-5, atol=0)
h_scale = torch.tensor(7.5)
args = (amax, h_scale, torch.float8_e5m2, torch.float8_e4m3fn, False)
want = swiglu_float8_grad_cast(dh, a1, a3, *args)
got = kernel.grad_cast(dh, a1, a3, *args, rows=32, cols=32)  # ragged tiles
assert torch.equal(got[5], amax_to_scale(amax, torch.float8_e5m2))
for w, g in zip(want[:5], got[:5]):
    assert g.shape == w.shape and g.dtype == w.dtype
    assert (w.view(torch.uint8) == g.view(torch.uint8)).float().mean() > 0.85
for row_major, transposed in ((got[0], got[1]), (got[2], got[3])):
    assert torch.equal(transposed.view(torch.uint8), row_major.t().contiguous().view(torch.uint8))
dh[7, 9] = float("nan")  # a NaN gradient gives NaN amaxes, as torch.max does (not skipped)
for amaxes in (kernel.grad_amax(dh, a1, a3), swiglu_float8_grad_amax(dh, a1, a3)):
    assert amaxes.isnan().all()
print("kernels ok")
"""


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton's CPU interpreter (on a GPU: tests/gpu/test_float8_swiglu_on_gpu.py)",
)
def test_the_kernels_layout_and_scales_under_the_interpreter():
    """The interpreter truncates to bf16 (and rounds float8 otherwise) where the GPU rounds to
    nearest, so only the amaxes (to a bf16 step or two; NaN kept), the scales from them, the
    layout (most bits equal, the transposes exact) are checked here; the GPU test checks the
    bits."""
    assert "kernels ok" in run_under_interpreter(KERNELS_CHECK)


@pytest.mark.parametrize("ac", ["none", pytest.param("selective", marks=pytest.mark.slow)])
def test_the_compiled_fused_block_keeps_no_more_for_the_backward(ac):
    """The fused function's backward reads what the unfused backward reads (the block input, the
    two projections, the weights, scalar scales): the forward keeps no more bytes, give or take
    a scalar (2 bytes more without AC, measured), and the norm outputs' tiled casts still run once
    each in the backward."""
    unfused = saved_for_backward(EMULATED, ac)
    fused = saved_for_backward(EMULATED, ac, fused_swiglu=True)
    assert fused["saved"] <= unfused["saved"] + 64
    assert (fused["forward casts"], fused["backward casts"]) == (0, 2)
