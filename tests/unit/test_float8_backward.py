"""Our tensorwise float8 backward (torchtitan/float8/matmul.py) on CPU, emulated: the bits
of torchao's Float8Linear, eager and compiled; which linears get it; falling back to torchao's
function; and what the compiled block keeps for the backward (the memory claim of
docs/float8.md)."""

from __future__ import annotations

import dataclasses
import importlib.util
import unittest.mock

import pytest
import torch
import torch.nn as nn
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.fx_passes.joint_graph import joint_graph_passes
from torch.multiprocessing.reductions import StorageWeakRef

from torchtitan.config import Float8
from torchtitan.float8.convert import apply_float8, import_torchao_float8
from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.models.llama3 import model as llama
from torchtitan.models.llama3.parallelize import LLAMA3
from torchtitan.parallel.activation_checkpoint import apply_ac

EMULATED = Float8(enable=True, emulate=True)
NORM_FED = ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3")


def llama_float8(model: nn.Module, cfg: Float8, fsdp_sharded: bool = False, **family):
    """``apply_float8`` as the composition calls it for Llama: the head kept in high precision
    and the norm-fed linears' input cast tiled (``family`` overrides either)."""
    family = {
        "model_exclude": LLAMA3.float8_exclude,
        "tiled_cast": LLAMA3.float8_tiled_cast,
        **family,
    }
    return apply_float8(model, cfg, fsdp_sharded, **family)


def torchaos_backward(model: nn.Module) -> nn.Module:
    """``model``'s float8 linears back to torchao's ``Float8Linear`` (its backward, its
    function), the reference our backwards are checked against."""
    ao = import_torchao_float8()
    for module in model.modules():
        if isinstance(module, ao.float8_linear.Float8Linear):
            module.__class__ = ao.float8_linear.Float8Linear
    return model


def two_linears(tiled: bool | None):
    """Two float8 linears in a row: torchao's backward (``tiled`` None) or ours."""
    ao = import_torchao_float8()
    from torchtitan.float8.matmul import Float8TensorwiseLinear

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96, bias=False), nn.Linear(96, 32, bias=False))
    ao.convert_to_float8_training(model, config=ao.Float8LinearConfig(emulate=True))
    if tiled is not None:
        for linear in model:
            linear.__class__ = Float8TensorwiseLinear
            linear.tiled_input_cast = tiled
    return model


def step(model) -> list[torch.Tensor]:
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 48, 64, generator=gen, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    out.backward(torch.randn(out.shape, generator=gen).bfloat16())
    return [out, x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("tiled", [True, False], ids=["tiled", "fused"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_bits_of_torchaos_float8_linear(compiled, tiled):
    """Compiled, inductor may skip a bf16 rounding eager does (the autocast cast before the amax),
    depending on how the graph is fused; rounding like eager, the bits must agree."""
    want = step(two_linears(None))
    ours = two_linears(tiled)
    with unittest.mock.patch("torch._inductor.config.emulate_precision_casts", True):
        got = step(torch.compile(ours) if compiled else ours)
    for name, w, g in zip(["out", "x.grad", "w1.grad", "w2.grad"], want, got):
        assert torch.equal(g, w), name


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_the_cast_operator_is_torchaos_cast_transposed(dtype):
    import_torchao_float8()
    from torchao.float8.float8_training_tensor import hp_tensor_and_scale_to_float8

    from torchtitan.float8.transposed_cast import float8_cast_transposed

    x = (torch.randn(100, 72, generator=torch.Generator().manual_seed(0)) * 300).bfloat16()
    x[0, :3] = torch.tensor([float("inf"), -1e6, 0.0])
    scale = torch.tensor(3.7)
    for operand in (x, x[:, 5:45]):
        want = hp_tensor_and_scale_to_float8(operand, scale, dtype)._data
        got = float8_cast_transposed(operand, scale, dtype)
        assert got.shape == (operand.shape[1], operand.shape[0]) and got.is_contiguous()
        assert torch.equal(got.t().view(torch.uint8), want.view(torch.uint8))


class CudaBf16:
    """Stands in for a bf16 CUDA tensor where the kernels are picked."""

    is_cuda, dtype = True, torch.bfloat16


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_cuda_tensors_find_the_cast_kernels():
    """Only CUDA tensors import the Triton kernels (by module name), so CPU runs would not see
    a name that no longer resolves; the GPU tests run the kernels."""
    from torchtitan.float8 import cast_kernel, transposed_cast

    assert transposed_cast.kernel_module(CudaBf16()) is cast_kernel
    assert transposed_cast.kernel_module(torch.ones(1)) is None


def meta_model() -> Transformer:
    with torch.device("meta"):
        return Transformer(get_model_args("debugmodel", max_seq_len=32))


def block_linears(cfg: Float8, **family) -> dict[str, nn.Module]:
    model = meta_model()
    llama_float8(model, cfg, **family)
    return {fqn: m for fqn, m in model.layers["0"].named_modules() if isinstance(m, nn.Linear)}


def test_every_tensorwise_linear_gets_our_backward_and_the_norm_fed_ones_the_tiled_cast():
    from torchtitan.float8.matmul import Float8TensorwiseLinear

    linears = block_linears(EMULATED)
    assert all(type(m) is Float8TensorwiseLinear for m in linears.values())
    tiled = {fqn for fqn, m in linears.items() if m.tiled_input_cast}
    assert tiled == set(NORM_FED)
    narrowed = block_linears(EMULATED, tiled_cast=["w1"])
    assert {fqn for fqn, m in narrowed.items() if m.tiled_input_cast} == {"feed_forward.w1"}


def test_the_conversion_line_names_the_tiled_linears():
    summary = llama_float8(meta_model(), EMULATED).summary(EMULATED)
    tiled = ", ".join(f"layers.*.{name}" for name in NORM_FED)
    assert summary.endswith(f"; our tensorwise backward, input cast tiled in: {tiled}")
    other = dataclasses.replace(EMULATED, recipe="rowwise_with_gw_hp")
    assert "backward" not in llama_float8(meta_model(), other).summary(other)


def test_torchaos_backward_when_not_tensorwise():
    ao = import_torchao_float8()
    linears = block_linears(dataclasses.replace(EMULATED, recipe="rowwise_with_gw_hp"))
    assert all(type(m) is ao.float8_linear.Float8Linear for m in linears.values())


def test_a_linear_told_so_runs_torchaos_function(monkeypatch):
    """``own_backward = False`` on a linear of ours sends its matmul to torchao's function."""
    from torchtitan.float8 import matmul as float8_matmul

    calls = []
    original = float8_matmul.matmul_with_hp_or_float8_args.apply
    monkeypatch.setattr(
        float8_matmul.matmul_with_hp_or_float8_args,
        "apply",
        lambda *args: calls.append(args) or original(*args),
    )
    linear = two_linears(tiled=True)[0]
    linear(torch.randn(4, 64))
    assert not calls
    linear.own_backward = False
    linear(torch.randn(4, 64))
    assert len(calls) == 1


def test_inputs_already_in_float8_go_to_torchaos_function(monkeypatch):
    """An activation already in float8 (as torchao's float8 TP styles would hand it): torchao's
    function takes it."""
    import torchao.float8.float8_linear as ao_linear
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic

    from torchtitan.float8 import matmul as float8_matmul

    calls = []
    original = ao_linear.matmul_with_hp_or_float8_args.apply
    monkeypatch.setattr(
        float8_matmul.matmul_with_hp_or_float8_args,
        "apply",
        lambda *args: calls.append(args) or original(*args),
    )
    linear = two_linears(tiled=True)[0]
    x = torch.randn(4, 64)
    linear(x)
    assert not calls
    linear(hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, linear.linear_mm_config))
    assert len(calls) == 1


def saved_for_backward(
    cfg: Float8,
    ac: str,
    op: str = "float8_cast_transposed",
    fused_swiglu: bool = False,
    torchao: bool = False,
) -> dict[str, int]:
    """Compile one debug-model block (inductor's joint-graph passes and partitioner, no inductor
    codegen; ``fused_swiglu``: its feed-forward as one float8 function; ``torchao``: torchao's
    float8 backward): the bytes of the storages the forward keeps for the backward (a view of a
    kept tensor costs nothing more) and where the calls of operator ``op`` run."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(get_model_args("debugmodel", max_seq_len=256))
    llama_float8(model, cfg)
    if torchao:
        torchaos_backward(model)
    if fused_swiglu:
        from torchtitan.experimental.float8_swiglu import use_fused_swiglu

        use_fused_swiglu(model)
    apply_ac(model, ac, "op", save_matmuls="alternate")
    block = model.layers["0"].to_empty(device="cpu")
    block.init_weights()
    args = get_model_args("debugmodel", max_seq_len=256)
    rope = llama.precompute_rope_cache(args.head_dim, 256, args.rope_theta)
    found = {}

    def casts(gm) -> int:
        calls = [n for n in gm.graph.nodes if n.op == "call_function"]
        return sum(op in str(n.target) for n in calls)

    def forward(gm, _):
        saved = list(gm.graph.find_nodes(op="output"))[0].args[0][1:]
        found["saved"] = _storage_bytes(saved)
        found["forward casts"] = casts(gm)
        return gm

    def backward(gm, _):
        found["backward casts"] = casts(gm)
        return gm

    def partition(joint, inputs, **kwargs):
        joint_graph_passes(joint)  # what inductor runs first (our float8_recompute pass among them)
        return min_cut_rematerialization_partition(joint, inputs, compiler="inductor", **kwargs)

    backend = aot_autograd(fw_compiler=forward, bw_compiler=backward, partition_fn=partition)
    compiled = torch.compile(block, backend=backend, fullgraph=True)
    x = torch.randn(2, 256, args.dim, requires_grad=True).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compiled(x, rope).float().sum().backward()
    return found


def _storage_bytes(nodes) -> int:
    """The bytes of the storages behind ``nodes``' tensors, each storage once (a view of a kept
    tensor, or a second name for it, costs nothing more)."""
    storages = {}
    for node in nodes:
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages[StorageWeakRef(storage)] = storage.nbytes()
    return sum(storages.values())


@pytest.mark.parametrize("ac", ["none", "selective", "full"])
def test_what_the_compiled_block_keeps_for_the_backward(ac):
    """The two norm outputs' tiled casts run once each in the backward (under AC in its
    recompute; without AC float8_recompute.py's pass sends them there, with the norm outputs
    they read), and the forward keeps what torchao's backward keeps, give or take its scalar
    scales."""
    ours = saved_for_backward(EMULATED, ac)
    torchao = saved_for_backward(EMULATED, ac, torchao=True)
    assert (ours["forward casts"], ours["backward casts"]) == (0, 2)
    assert 0 <= ours["saved"] - torchao["saved"] <= 64
    assert torchao["forward casts"] == torchao["backward casts"] == 0


@pytest.mark.parametrize("layout", ["fsdp", "tp"])
def test_our_backward_runs_under_fsdp_float8_all_gather_and_tp_shard_scales(
    layout, tmp_path, monkeypatch
):
    """FSDP2 hands the linears plain (or, with float8 all-gather, float8) unsharded weights, and
    TP's shard-scaled linears their local shards: none of them is a DTensor, so every block linear
    runs our function, not torchao's (one-rank gloo meshes; across ranks the parity runs of
    tests/distributed/test_float8.py train through the same path)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from torchtitan.float8 import matmul as float8_matmul
    from torchtitan.float8.tp import scale_float8_by_shard
    from torchtitan.models.llama3.parallelize import block_tp_plan, root_tp_plan
    from torchtitan.parallel.fsdp import apply_fsdp
    from torchtitan.parallel.tensor_parallel import apply_tp

    calls = {"ours": 0, "torchao": 0}

    def counted(name, apply):
        def wrapper(*args):
            calls[name] += 1
            return apply(*args)

        return wrapper

    ours, torchao = (
        float8_matmul.TensorwiseFloat8Matmul,
        float8_matmul.matmul_with_hp_or_float8_args,
    )
    monkeypatch.setattr(ours, "apply", counted("ours", ours.apply))
    monkeypatch.setattr(torchao, "apply", counted("torchao", torchao.apply))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = Transformer(get_model_args("debugmodel", max_seq_len=32))
        model.init_weights()
        mesh = init_device_mesh("cpu", (1,))
        if layout == "fsdp":
            cfg = dataclasses.replace(EMULATED, fsdp_float8_all_gather=True)
            llama_float8(model, cfg, fsdp_sharded=True)
            apply_fsdp(model, mesh, param_dtype=torch.bfloat16)
        else:
            llama_float8(model, EMULATED)
            apply_tp(model, mesh, root_tp_plan(False), block_tp_plan())
            scale_float8_by_shard(model)
        model(torch.randint(256, (2, 32))).float().square().mean().backward()
    finally:
        dist.destroy_process_group()
    assert calls == {"ours": 7 * len(model.layers), "torchao": 0}
