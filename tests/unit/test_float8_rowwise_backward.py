"""Our rowwise float8 backward (torchtitan/float8/rowwise_matmul.py) on CPU, emulated:
the column-wise cast operator is torchao's cast; its kernels' scales are torchao's under Triton's
interpreter; a float8 block computes torchao's bits, eager, compiled and under selective
checkpointing; which linears get it; the fallbacks."""

from __future__ import annotations

import dataclasses
import importlib.util
import unittest.mock

import pytest
import torch
import torch.nn as nn

from tests.unit.test_float8_backward import saved_for_backward, torchaos_backward
from tests.unit.triton_interpreter import run_under_interpreter
from torchtitan.config import Float8
from torchtitan.float8.convert import apply_float8, import_torchao_float8
from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.models.llama3 import model as llama
from torchtitan.parallel.activation_checkpoint import apply_ac

ROWWISE = Float8(enable=True, emulate=True, recipe="rowwise")


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("power_of_2", [True, False], ids=["pow2", "exact"])
def test_the_columnwise_cast_is_torchaos(dtype, power_of_2):
    import_torchao_float8()
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    from torchtitan.float8.rowwise_matmul import float8_cast_columnwise

    x = (torch.randn(100, 72, generator=torch.Generator().manual_seed(0)) * 300).bfloat16()
    x[0, :3] = torch.tensor([float("inf"), -1e6, 0.0])
    x[:, 9] = 0.0  # a column of zeros: torchao's EPS floor on the amax
    for operand in (x, x[:, 5:45]):
        want = hp_tensor_to_float8_dynamic(
            operand,
            dtype,
            LinearMMConfig(),
            scaling_granularity=ScalingGranularity.AXISWISE,
            axiswise_dim=0,
            round_scales_to_power_of_2=power_of_2,
        )
        bits, scale = float8_cast_columnwise(operand, dtype, power_of_2)
        assert bits.shape == operand.shape[::-1] and bits.is_contiguous()
        assert torch.equal(scale, want._scale)
        assert torch.equal(bits.t().view(torch.uint8), want._data.view(torch.uint8))


KERNEL_SCALES_CHECK = """
import torch
from torchao.float8.float8_utils import amax_to_scale
from torchtitan.float8 import cast_kernel as k

x = (torch.randn(300, 410, generator=torch.Generator().manual_seed(0)) * 80).bfloat16()
x[0, :3] = torch.tensor([float("inf"), -1e6, 0.0])
x[:, 9] = 0.0
x[:, 20] = 1e-30  # under torchao's EPS floor
for operand in (x, x[:, 7:300].contiguous()):
    amax = k.column_amax(operand)
    assert torch.equal(amax, operand.float().abs().amax(0, keepdim=True))
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        bits, scale = k.cast_columnwise_from_amax(operand, amax, dtype, False)
        assert torch.equal(scale, amax_to_scale(amax, dtype, False)), dtype
        assert bits.shape == operand.t().shape and bits.dtype == dtype
print("scales ok")
"""


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton's CPU interpreter (on a GPU: tests/gpu/test_float8_cast_on_gpu.py)",
)
def test_the_cast_kernel_computes_torchaos_scales_under_the_interpreter():
    """The column amax kernel and the scales the cast kernel computes from it, under Triton's
    interpreter. Without the power-of-2 rounding (its libdevice functions do not run there) and
    without the bits (the interpreter rounds float8 otherwise): the GPU test checks both."""
    assert "scales ok" in run_under_interpreter(KERNEL_SCALES_CHECK)


def test_the_operator_passes_torchs_checks():
    from torchtitan.float8.rowwise_matmul import float8_cast_columnwise

    x = torch.randn(16, 24).bfloat16()
    torch.library.opcheck(float8_cast_columnwise, (x, torch.float8_e4m3fn, True))


def block(cfg: Float8, ac: bool, input_cast: bool, torchao: bool = False) -> nn.Module:
    """The first block of the debug model, float8 as the trainer converts it (``input_cast``:
    the inputs' column-wise cast ours, as the trainer's; otherwise torchao's; ``torchao``:
    torchao's backward) and checkpointed as the trainer's selective AC does."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(get_model_args("debugmodel", max_seq_len=64))
    apply_float8(model, cfg)
    if torchao:
        torchaos_backward(model)
    for module in model.modules():
        if hasattr(module, "columnwise_input_cast"):
            module.columnwise_input_cast = input_cast
    apply_ac(model, "selective" if ac else "none", "op", save_matmuls="alternate")
    first = model.layers["0"].to_empty(device="cpu")
    first.init_weights()
    return first


def step(model) -> list[torch.Tensor]:
    torch._dynamo.reset()
    args = get_model_args("debugmodel", max_seq_len=64)
    rope = llama.precompute_rope_cache(args.head_dim, 64, args.rope_theta)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 64, args.dim, generator=gen).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x, rope)
    out.backward(torch.randn(out.shape, generator=gen).bfloat16())
    return [out, x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("input_cast", [False, True], ids=["gradients", "gradients and inputs"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled with selective AC"])
def test_a_block_computes_torchaos_bits(compiled, input_cast):
    """Compiled, both round like eager (``emulate_precision_casts``, as the trainer does for
    rowwise under selective AC), so the bits must agree."""
    with unittest.mock.patch("torch._inductor.config.emulate_precision_casts", True):
        results = []
        for torchao in (True, False):
            model = block(ROWWISE, ac=compiled, input_cast=input_cast, torchao=torchao)
            results.append(step(torch.compile(model) if compiled else model))
    for i, (want, got) in enumerate(zip(*results)):
        assert torch.equal(got, want), i


def meta_linears(cfg: Float8) -> list[nn.Module]:
    with torch.device("meta"):
        model = Transformer(get_model_args("debugmodel", max_seq_len=32))
    apply_float8(model, cfg)
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def test_every_rowwise_linear_gets_our_backward_and_the_log_says_so():
    from torchtitan.float8.rowwise_matmul import Float8RowwiseLinear

    with torch.device("meta"):
        model = Transformer(get_model_args("debugmodel", max_seq_len=32))
    summary = apply_float8(model, ROWWISE).summary(ROWWISE)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is Float8RowwiseLinear for m in linears)
    assert all(m.columnwise_input_cast for m in linears)
    assert summary.endswith(
        f"; our rowwise backward in {len(linears)} linears (output gradients and inputs cast "
        "column-wise in a kernel of our own)"
    )


# Full AC in the slow tier (make test-all), for CI's time.
@pytest.mark.parametrize("ac", ["none", "selective", pytest.param("full", marks=pytest.mark.slow)])
def test_the_input_casts_run_in_the_backward_and_keep_no_more_than_torchaos(ac):
    """The memory claim of docs/float8.md: the inputs' column-wise casts run in the backward
    (under AC in its recompute; without AC float8_recompute.py's pass sends them there), so the
    forward keeps no more than torchao's backward (give or take scalars; without AC torchao's
    keeps the float8 cast of wo's input, which ours recomputes). Each block has 7 linears: 7
    gradient casts, and the inputs of 4 (the norm outputs are shared by wq/wk/wv and by w1/w3,
    so their casts are one each)."""
    ours = saved_for_backward(ROWWISE, ac, op="float8_cast_columnwise")
    torchao = saved_for_backward(ROWWISE, ac, op="float8_cast_columnwise", torchao=True)
    assert (ours["forward casts"], ours["backward casts"]) == (0, 7 + 4)
    assert torchao["forward casts"] == torchao["backward casts"] == 0
    assert ours["saved"] - torchao["saved"] <= 64


def test_torchaos_backward_for_rowwise_with_gw_hp():
    ao = import_torchao_float8()
    cfg = dataclasses.replace(ROWWISE, recipe="rowwise_with_gw_hp")
    assert all(type(m) is ao.float8_linear.Float8Linear for m in meta_linears(cfg))


def test_inputs_already_in_float8_go_to_torchaos_function(monkeypatch):
    import torchao.float8.float8_linear as ao_linear
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic

    from torchtitan.float8 import rowwise_matmul as float8_rowwise_matmul

    linear = block(ROWWISE, ac=False, input_cast=True).feed_forward.w1
    calls = []
    original = ao_linear.matmul_with_hp_or_float8_args.apply
    monkeypatch.setattr(
        float8_rowwise_matmul.matmul_with_hp_or_float8_args,
        "apply",
        lambda *a: calls.append(a) or original(*a),
    )
    x = torch.randn(8, linear.in_features)
    x8 = hp_tensor_to_float8_dynamic(
        x,
        torch.float8_e4m3fn,
        linear.linear_mm_config,
        scaling_granularity=ScalingGranularity.AXISWISE,
        axiswise_dim=-1,
        round_scales_to_power_of_2=True,
    )
    linear(x8)
    assert len(calls) == 1
    linear(x)
    assert len(calls) == 1  # plain inputs take ours


def test_ours_runs_under_fsdp(tmp_path, monkeypatch):
    """FSDP2 hands the linears plain unsharded weights, so every float8 linear runs our function
    (one-rank gloo mesh); under TP their weights are DTensors and torchao's runs."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from torchtitan.float8 import rowwise_matmul as float8_rowwise_matmul
    from torchtitan.parallel.fsdp import apply_fsdp

    calls = {"ours": 0, "torchao": 0}
    functions = {
        "ours": float8_rowwise_matmul.RowwiseFloat8Matmul,
        "torchao": float8_rowwise_matmul.matmul_with_hp_or_float8_args,
    }
    for name, function in functions.items():
        original = function.apply
        monkeypatch.setattr(
            function,
            "apply",
            lambda *a, name=name, f=original: calls.update({name: calls[name] + 1}) or f(*a),
        )
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = Transformer(get_model_args("debugmodel", max_seq_len=32))
        model.init_weights()
        apply_float8(model, ROWWISE, fsdp_sharded=True)
        apply_fsdp(model, init_device_mesh("cpu", (1,)), param_dtype=torch.bfloat16)
        model(torch.randint(256, (2, 32))).float().square().mean().backward()
    finally:
        dist.destroy_process_group()
    assert calls == {"ours": 7 * len(model.layers) + 1, "torchao": 0}  # + the head
