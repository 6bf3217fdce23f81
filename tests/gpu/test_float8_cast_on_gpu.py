"""Our tensorwise float8 backward on a GPU (torchtitan/float8/matmul.py): the tiled
cast's Triton kernel and the one-pass cast of FSDP's float8 all-gather write the bits of
torchao's cast, and two float8 linears with it compute
what torchao's Float8Linear computes in eager, bit for bit, eager and compiled.

Compiled, inductor skips some bf16 roundings eager does (the autocast cast of the input before
its amax and float8 cast), and where it skips them depends on how the graph is fused and
partitioned: compiled torchao is 2.5 % (relative) off its own eager output on this test. So the
compiled runs round like eager (``emulate_precision_casts``) to compare bits."""

from __future__ import annotations

import copy
import unittest.mock

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs a CUDA device with float8 (compute capability 8.9+)",
)


def test_kernel_writes_the_bits_of_torchaos_cast():
    from torchao.float8.float8_training_tensor import hp_tensor_and_scale_to_float8

    from torchtitan.float8.transposed_cast import float8_cast_transposed

    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(1000, 4100, device="cuda", generator=g) * 80).bfloat16()
    x[0, :3] = torch.tensor([float("inf"), -1e6, 0.0])
    scale = torch.tensor(2.9, device="cuda")
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        for operand in (x, x[:, 7:3000]):  # contiguous and a row stride wider than the row
            want = hp_tensor_and_scale_to_float8(operand, scale, dtype)._data
            got = float8_cast_transposed(operand, scale, dtype)
            assert got.shape == operand.shape[::-1] and got.is_contiguous()
            assert torch.equal(got.t().view(torch.uint8), want.view(torch.uint8)), dtype


def test_flat_kernel_writes_the_bits_of_torchaos_cast():
    """The one-pass cast of FSDP's float8 all-gather (torchtitan/float8/all_gather.py)
    against torchao's eager cast, float32 and bf16 shards, a size no multiple of the block."""
    from torchao.float8.float8_training_tensor import hp_tensor_and_scale_to_float8

    from torchtitan.float8.all_gather import cast_to_float8

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1000, 4100, device="cuda", generator=g) * 80
    x[0, :3] = torch.tensor([float("inf"), -1e6, 0.0])
    scale = torch.tensor(2.9, device="cuda")
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        for shard in (x, x.bfloat16(), x[1:]):
            want = hp_tensor_and_scale_to_float8(shard, scale, dtype)._data
            got = cast_to_float8(shard, scale, dtype)
            assert got.shape == shard.shape
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (dtype, shard.dtype)


def linears(tiled: bool):
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from torchtitan.float8.matmul import Float8TensorwiseLinear

    torch.manual_seed(0)
    torchao = torch.nn.Sequential(
        torch.nn.Linear(2048, 4096, bias=False), torch.nn.Linear(4096, 1024, bias=False)
    ).cuda()
    convert_to_float8_training(torchao, config=Float8LinearConfig())
    ours = copy.deepcopy(torchao)
    for module in ours:
        module.__class__ = Float8TensorwiseLinear
        module.tiled_input_cast = tiled
    return torchao, ours


def compiled_as_trained(model):
    """``model`` compiled with the trainer's joint-graph pass, which recomputes our casts in the
    backward (float8_recompute.py; without AC the forward would run them otherwise)."""
    from torchtitan.float8.recompute import recompute_float8_casts_in_backward

    recompute_float8_casts_in_backward()
    return torch.compile(model)


def step(model, x, grad):
    torch._dynamo.reset()
    x = x.detach().clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(x)
    out.backward(grad)
    return [out, x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("tiled", [True, False], ids=["tiled", "fused"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_linear_matches_torchaos_float8_linear(compiled, tiled):
    torchao, ours = linears(tiled)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(2, 4096, 2048, device="cuda", generator=g)
    grad = torch.randn(2, 4096, 1024, device="cuda", generator=g).bfloat16()
    want = step(torchao, x, grad)
    with unittest.mock.patch("torch._inductor.config.emulate_precision_casts", True):
        got = step(compiled_as_trained(ours) if compiled else ours, x, grad)
    for name, w, o in zip(["out", "x.grad", "w1.grad", "w2.grad"], want, got):
        assert torch.equal(o, w), f"{name}: {(o - w).float().norm() / w.float().norm():.2e}"


def test_columnwise_cast_kernels_write_the_bits_of_torchaos_cast():
    """Rowwise float8's column-wise cast (torchtitan/float8/rowwise_matmul.py): the
    column amax kernel and the per-column tiled cast against torchao's axiswise cast."""
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    from torchtitan.float8.rowwise_matmul import float8_cast_columnwise

    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(3000, 4100, device="cuda", generator=g) * 80).bfloat16()
    x[0, :3] = torch.tensor([float("inf"), -1e6, 0.0])
    x[:, 9] = 0.0
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        for operand in (x, x[:, 7:3000], x[5:]):
            want = hp_tensor_to_float8_dynamic(
                operand,
                dtype,
                LinearMMConfig(),
                scaling_granularity=ScalingGranularity.AXISWISE,
                axiswise_dim=0,
                round_scales_to_power_of_2=True,
            )
            bits, scale = float8_cast_columnwise(operand, dtype, True)
            assert torch.equal(scale, want._scale), dtype
            assert torch.equal(bits.t().view(torch.uint8), want._data.view(torch.uint8)), dtype


@pytest.mark.parametrize("input_cast", [False, True], ids=["gradients", "gradients_and_inputs"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_rowwise_linear_matches_torchaos_float8_linear(compiled, input_cast):
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from torchtitan.float8.rowwise_matmul import Float8RowwiseLinear

    torch.manual_seed(0)
    torchao = torch.nn.Sequential(
        torch.nn.Linear(2048, 4096, bias=False), torch.nn.Linear(4096, 1024, bias=False)
    ).cuda()
    convert_to_float8_training(torchao, config=Float8LinearConfig.from_recipe_name("rowwise"))
    ours = copy.deepcopy(torchao)
    for module in ours:
        module.__class__ = Float8RowwiseLinear
        module.columnwise_input_cast = input_cast
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(2, 4096, 2048, device="cuda", generator=g)
    grad = torch.randn(2, 4096, 1024, device="cuda", generator=g).bfloat16()
    with unittest.mock.patch("torch._inductor.config.emulate_precision_casts", True):
        want = step(torch.compile(torchao) if compiled else torchao, x, grad)
        got = step(compiled_as_trained(ours) if compiled else ours, x, grad)
    for name, w, o in zip(["out", "x.grad", "w1.grad", "w2.grad"], want, got):
        assert torch.equal(o, w), f"{name}: {(o - w).float().norm() / w.float().norm():.2e}"
