"""Float8 training glue (torchtitan/parallel/float8.py) on CPU: config and device checks, which
linears are converted, how close a float8 linear is to fp32, what selective AC keeps, and that
parameter names, shapes and dtypes stay those of the plain model."""

import logging
import sys
import types
from functools import partial

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy

from torchtitan.config import ConfigError, Float8, parse_args
from torchtitan.loss import ChunkedLossHead, use_chunked_loss_head
from torchtitan.metrics import MetricsLogger, StepStats
from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.parallel.activation_checkpoint import _ops_to_save, _selective_policy, apply_ac
from torchtitan.parallel.float8 import (
    apply_float8,
    check_float8,
    float8_device_problem,
    float8_tp_plan,
    import_torchao_float8,
    is_float8_linear,
    recompute_must_round_like_forward,
    too_small,
)
from torchtitan.parallel.llama import llama_block_plan

aten = torch.ops.aten
LINEARS_PER_BLOCK = 7
EMULATED = dict(enable=True, emulate=True, skip_small=False)


def meta_model(flavor: str = "debugmodel", **overrides) -> Transformer:
    with torch.device("meta"):
        return Transformer(get_model_args(flavor, max_seq_len=32, **overrides))


def cpu_model(**float8) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(get_model_args("debugmodel", max_seq_len=32))
    model.init_weights()
    if float8:
        apply_float8(model, Float8(**float8))
    return model


# --------------------------------------------------------------------------- config and checks


def test_config_parses_and_suggests():
    cfg = parse_args(["--float8.enable", "--float8.recipe", "rowwise", "--float8.filter_fqns="])
    assert (cfg.float8.enable, cfg.float8.recipe, cfg.float8.filter_fqns) == (True, "rowwise", [])
    assert Float8().filter_fqns == ["output"]
    with pytest.raises(ConfigError, match="did you mean 'rowwise'"):
        parse_args(["--float8.recipe", "rowwize"])


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--float8.recipe=rowwise", "--float8.fsdp_float8_all_gather"],
            "fsdp_float8_all_gather needs --float8.recipe tensorwise",
        ),
        (["--float8.precompute_scales"], "precompute_scales needs --float8.fsdp_float8_all_gather"),
    ],
)
def test_invalid_combinations_fail_in_one_line(args, message):
    with pytest.raises(ConfigError, match=message) as e:
        parse_args(args)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "cfg, cuda, name, capability, problem",
    [
        (Float8(enable=True), False, "", (0, 0), "on CPU needs --float8.emulate"),
        (
            Float8(enable=True),
            True,
            "NVIDIA A100-SXM4-80GB",
            (8, 0),
            "float8 needs compute capability >= 8.9 (H100/H200/L40S/RTX 4090); "
            "NVIDIA A100-SXM4-80GB is 8.0",
        ),
        (Float8(enable=True), True, "NVIDIA H100 80GB HBM3", (9, 0), None),
        (Float8(enable=True), True, "NVIDIA L40S", (8, 9), None),
        (Float8(enable=True, emulate=True), False, "", (0, 0), None),
        (Float8(enable=True, emulate=True), True, "NVIDIA A100-SXM4-80GB", (8, 0), None),
        (Float8(), True, "NVIDIA A100-SXM4-80GB", (8, 0), None),
    ],
)
def test_device_problems(cfg, cuda, name, capability, problem):
    got = float8_device_problem(cfg, cuda, name, capability)
    assert got == problem if problem is None else problem in got


def test_preflight_rejects_cpu_without_emulate(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="needs --float8.emulate"):
        check_float8(Float8(enable=True))
    check_float8(Float8(enable=True, emulate=True))
    check_float8(Float8())


@pytest.mark.parametrize(
    "float8, compiled, ac_mode, ac_option, rounds",
    [
        (dict(recipe="rowwise"), True, "selective", "op", True),
        (dict(recipe="rowwise_with_gw_hp"), True, "selective", "op", True),
        (dict(recipe="rowwise", emulate=True), True, "selective", "op", True),
        (dict(recipe="rowwise"), False, "selective", "op", False),  # eager recomputes exactly
        (dict(recipe="rowwise"), True, "selective", "2", False),  # whole blocks recomputed
        (dict(recipe="rowwise"), True, "full", "op", False),
        (dict(recipe="rowwise"), True, "none", "op", False),
        (dict(recipe="tensorwise"), True, "selective", "op", False),
    ],
)
def test_rowwise_compiled_selective_op_rounds_like_eager(
    float8, compiled, ac_mode, ac_option, rounds
):
    """pytorch/pytorch#150859: without eager rounding the recomputed K/V differ from the
    forward's and the gradients blow up (8B FSDP4, H200; docs/float8.md)."""
    cfg = Float8(enable=True, **float8)
    assert recompute_must_round_like_forward(cfg, compiled, ac_mode, ac_option) == rounds
    assert not recompute_must_round_like_forward(Float8(**float8), compiled, ac_mode, ac_option)


@pytest.mark.parametrize("recipe, rounds", [("rowwise", True), ("tensorwise", False)])
def test_parallelize_sets_eager_rounding_for_rowwise_selective_op(tmp_path, recipe, rounds):
    import torch._inductor.config as inductor_config

    from tests.unit.test_train import make_trainer

    args = ["--float8.enable", "--float8.emulate", f"--float8.recipe={recipe}", "--compile.enable"]
    with inductor_config.patch(emulate_precision_casts=False):  # restored on exit
        make_trainer(tmp_path, *args, "--activation_checkpoint.mode=selective").close()
        assert inductor_config.emulate_precision_casts is rounds


def test_missing_torchao_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    with pytest.raises(ConfigError, match=r'torchao .*pip install -e "\.\[float8\]"'):
        import_torchao_float8()
    check_float8(Float8())  # float8 off: torchao is not needed


# --------------------------------------------------------------------------- which linears


def test_debug_model_converts_every_block_linear_but_not_the_head():
    conversion = apply_float8(model := meta_model(), Float8(**EMULATED))
    assert len(conversion.converted) == LINEARS_PER_BLOCK * model.args.n_layers
    assert conversion.skipped == {"output": "filter_fqns"}
    assert not is_float8_linear(model.output)
    assert all(is_float8_linear(model.layers[i].feed_forward.w2) for i in model.layers)


def test_dims_not_divisible_by_16_are_skipped_and_listed_once(caplog):
    model = meta_model(multiple_of=2)  # SwiGLU hidden 682: w1, w2, w3 cannot be float8
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        conversion = apply_float8(model, Float8(**EMULATED))
    assert len(conversion.converted) == 4 * model.args.n_layers
    assert conversion.skipped["layers.5.feed_forward.w2"] == "682->256: dims not divisible by 16"
    (line,) = [r.getMessage() for r in caplog.records if "float8 (" in r.getMessage()]
    assert "layers.*.feed_forward.w1 (256->682: dims not divisible by 16)" in line
    assert "output (filter_fqns)" in line
    assert "layers.0" not in line and line.count("w2") == 1


def test_small_linears_are_skipped_with_skip_small():
    # Llama 3 8B, tensorwise: wk and wv (4096 -> 1024) are too small to gain on their own.
    assert len(apply_float8(meta_model("8B"), Float8(enable=True)).converted) == 7 * 32
    conversion = apply_float8(model := meta_model("8B"), Float8(enable=True, skip_small=True))
    assert len(conversion.converted) == 5 * model.args.n_layers
    assert conversion.skipped["layers.31.attention.wv"] == "4096->1024: too small to gain"
    assert too_small("tensorwise", 4096, 1024) and not too_small("tensorwise", 4096, 14336)
    assert too_small("rowwise", 4096, 2048) and not too_small("rowwise", 4096, 4096)


def test_a_head_with_its_own_forward_stays_in_high_precision():
    # The fused loss's head computes the loss in its forward; a float8 swap would drop that.
    use_chunked_loss_head(model := meta_model(), chunk_tokens=8)
    conversion = apply_float8(model, Float8(**EMULATED, filter_fqns=[]))
    assert conversion.skipped == {"output": "a ChunkedLossHead, not a plain nn.Linear"}
    assert type(model.output) is ChunkedLossHead


def test_nothing_converted_warns(caplog):
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        assert apply_float8(meta_model(), Float8(enable=True, skip_small=True)).converted == []
    assert any("no linear was converted" in r.getMessage() for r in caplog.records)


def test_names_shapes_and_dtypes_are_those_of_the_plain_model():
    plain, float8 = cpu_model(), cpu_model(**EMULATED)
    got = {k: (v.shape, v.dtype) for k, v in float8.state_dict().items()}
    assert got == {k: (v.shape, v.dtype) for k, v in plain.state_dict().items()}
    # A seed written without float8 loads into a float8 model, and back.
    float8.load_state_dict(plain.state_dict(), strict=True)
    plain.load_state_dict(float8.state_dict(), strict=True)


# --------------------------------------------------------------------------- numerics


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).norm() / expected.norm()).item()


def linear_run(float8: Float8 | None) -> list[torch.Tensor]:
    """Output, grad_input and grad_weight of one 256 -> 512 linear (fp32 when ``float8`` is None)
    on the same weights, inputs and output gradient."""
    torch.manual_seed(0)
    linear = nn.Sequential(nn.Linear(256, 512, bias=False))
    if float8 is not None:
        apply_float8(linear, float8)
    x = torch.randn(8, 64, 256, requires_grad=True)
    out = linear(x)
    out.backward(torch.randn_like(out))
    return [out.detach(), x.grad, linear[0].weight.grad]


def linear_errors(recipe: str, emulate: bool = True) -> dict[str, float]:
    """Relative L2 errors of a float8 linear's output and gradients against fp32."""
    float8 = Float8(enable=True, recipe=recipe, emulate=emulate, skip_small=False)
    errors = map(relative_error, linear_run(float8), linear_run(None))
    return dict(zip(("output", "grad_input", "grad_weight"), errors))


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_float8_linear_is_close_to_fp32(recipe):
    """Round-to-nearest with m mantissa bits errs uniformly within half an ulp, and an ulp is
    2^-m to 2^-(m+1) of the value: an RMS relative error of at most 2^-m / sqrt(12), 0.036 for
    e4m3 (m = 3) and 0.072 for e5m2 (m = 2). A product of two casts adds both in quadrature
    (0.051 for e4m3 x e4m3, 0.081 for tensorwise's e5m2 gradients x e4m3), and a dot product of
    random-sign terms keeps that relative error. Measured: 0.036 (every output, rowwise
    gradients), 0.058 (tensorwise gradients). The bound 0.1 holds them with room; above 0.01
    shows the casts really ran (fp32 would give ~1e-7, bf16 ~3e-3). rowwise_with_gw_hp computes
    grad_weight from the high-precision input and gradient: fp32 exactly."""
    errors = linear_errors(recipe)
    if recipe == "rowwise_with_gw_hp":
        assert errors.pop("grad_weight") < 1e-6
    for name, error in errors.items():
        assert 0.01 < error < 0.1, (name, error)


def _cpu_scaled_mm() -> bool:
    try:
        a = torch.ones(16, 16).to(torch.float8_e4m3fn)
        one = torch.ones((), dtype=torch.float32)
        torch._scaled_mm(a, a.t(), one, one, out_dtype=torch.float32)
        return True
    except (RuntimeError, NotImplementedError):
        return False


needs_cpu_scaled_mm = pytest.mark.skipif(
    not _cpu_scaled_mm(), reason="torch has no CPU torch._scaled_mm kernel"
)


@needs_cpu_scaled_mm
def test_emulate_matches_the_scaled_mm_kernel():
    """--float8.emulate (torchao's emulate=True) runs the same casts and does the matmul in fp32
    on the dequantized values; torch's CPU _scaled_mm kernel (torch >= 2.13) agrees to fp32
    rounding for tensorwise (measured 1.1e-7). (Its rowwise path differs by 1.6e-3.)"""
    emulated = linear_run(Float8(enable=True, emulate=True, skip_small=False))
    kernel = linear_run(Float8(enable=True, emulate=False, skip_small=False))
    for a, b in zip(emulated, kernel):
        assert relative_error(a, b) < 1e-6


# --------------------------------------------------------------------------- selective AC


class CountOps(TorchDispatchMode):
    def __init__(self, ops):
        super().__init__()
        self.ops, self.count = ops, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in self.ops
        return func(*args, **(kwargs or {}))


def backward_ops(ops, mode: str, save_matmuls: str = "all", emulate: bool = False) -> int:
    model = cpu_model(enable=True, emulate=emulate, skip_small=False)
    apply_ac(model, mode, "op", save_matmuls=save_matmuls)
    loss = model(torch.randint(model.args.vocab_size, (2, 32))).float().square().mean()
    with CountOps(ops) as counter:
        loss.backward()
    return counter.count


@pytest.mark.parametrize("emulate", [True, pytest.param(False, marks=needs_cpu_scaled_mm)])
def test_selective_op_keeps_float8_matmuls_and_amax_outputs(emulate):
    """SAC sees torchao's float8 matmul as aten.mm on float8 tensors (the _scaled_mm runs inside
    the tensor subclass; the same under compile) and the casts' amax as aten.max."""
    n_layers = get_model_args("debugmodel").n_layers
    mm, amax = {aten.mm.default}, {aten.max.default}
    no_ac = backward_ops(mm, "none", emulate=emulate)
    assert no_ac == 2 * LINEARS_PER_BLOCK * n_layers + 2
    assert backward_ops(mm, "selective", emulate=emulate) == no_ac
    assert backward_ops(mm, "selective", "alternate", emulate=emulate) == no_ac + 3 * n_layers
    # backward computes the amax of its own casts only: the forward's are kept
    no_ac_amax = backward_ops(amax, "none", emulate=emulate)
    assert backward_ops(amax, "selective", emulate=emulate) == no_ac_amax
    assert backward_ops(amax, "full", emulate=emulate) > no_ac_amax


def test_scaled_mm_counts_as_a_matmul_for_alternate():
    """Where the float8 kernel itself reaches the policy, it is saved like any matmul (every
    other one with save_matmuls=alternate), and so are amax reductions."""
    ctx = types.SimpleNamespace(is_recompute=False)
    counts = {"forward": 0, "recompute": 0}
    policy = partial(_selective_policy, _ops_to_save(), True, counts)
    decisions = [policy(ctx, op) for op in [aten._scaled_mm.default, aten.mm.default] * 2]
    assert decisions == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE] * 2
    assert policy(ctx, aten.max.default) == CheckpointPolicy.MUST_SAVE


# --------------------------------------------------------------------------- TP and metrics


def test_float8_tp_styles_only_when_asked_for_tensorwise_on_cuda_with_every_linear_float8():
    converted = meta_model()
    apply_float8(converted, Float8(**EMULATED))
    asked = dict(EMULATED, tp_float8_all_gather=True, tp_shard_scales=False)
    assert float8_tp_plan(converted, Float8(**asked), "cuda")
    assert not float8_tp_plan(converted, Float8(**EMULATED), "cuda")  # the default: plain styles
    assert not float8_tp_plan(converted, Float8(**asked), "cpu")  # gloo: no float8 all-gather
    assert not float8_tp_plan(converted, Float8(**asked, recipe="rowwise"), "cuda")
    partly = meta_model(multiple_of=2)
    apply_float8(partly, Float8(**EMULATED))
    assert not float8_tp_plan(partly, Float8(**asked), "cuda")
    assert not float8_tp_plan(meta_model(), Float8(tp_float8_all_gather=True), "cuda")


def test_block_plan_with_float8_styles():
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    plan, plain = llama_block_plan(float8=True), llama_block_plan()
    assert plan.keys() == plain.keys()
    assert isinstance(plan["attention"], PrepareFloat8ModuleInput)
    assert isinstance(plan["attention.wq"], Float8ColwiseParallel)
    assert isinstance(plan["feed_forward.w2"], Float8RowwiseParallel)
    assert plan["feed_forward.w2"].output_layouts == plain["feed_forward.w2"].output_layouts
    assert not isinstance(plain["attention.wq"], Float8ColwiseParallel)


def test_float8_tp_styles_run_the_llama_plan_on_a_one_rank_mesh(tmp_path):
    """gloo cannot all-gather float8 across ranks, but on a one-rank mesh torchao's float8 styles
    run the whole plan on CPU: the casts before the (trivial) all-gather, the rope cache passed
    through, the float8 gradient casts. Same loss and gradients as without TP."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from torchtitan.parallel.llama import llama_root_plan
    from torchtitan.parallel.tensor_parallel import apply_tp

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        reference, tp = cpu_model(**EMULATED), cpu_model(**EMULATED)
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
        apply_tp(tp, mesh, llama_root_plan(False), llama_block_plan(float8=True))
        tokens = torch.randint(tp.args.vocab_size, (2, 32))
        losses = [m(tokens).float().square().mean() for m in (reference, tp)]
        for loss in losses:
            loss.backward()
        assert losses[0].item() == pytest.approx(losses[1].item(), rel=1e-6)
        grads = [m.layers["0"].attention.wq.weight.grad for m in (reference, tp)]
        torch.testing.assert_close(grads[1].full_tensor(), grads[0])
    finally:
        dist.destroy_process_group()


def test_mfu_is_labelled_with_its_bf16_basis(monkeypatch, caplog):
    import torchtitan.metrics as metrics

    monkeypatch.setattr(metrics, "peak_flops", lambda device: 1e12)
    logger = MetricsLogger(torch.device("cpu"), 10**9, 10, 1, enabled=True, float8=True)
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        got = logger.record(StepStats(1, 2.0, 1.0, 1e-3, 1000, 0.0))
    assert "mfu_bf16_peak_pct" in got and "mfu_pct" not in got
    assert "mfu(bf16 peak)" in caplog.records[-1].getMessage()
