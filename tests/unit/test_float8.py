"""Float8 training glue (torchtitan/float8/convert.py) on CPU: config and device checks, which
linears are converted, how close a float8 linear is to fp32, what selective AC keeps, and that
parameter names, shapes and dtypes stay those of the plain model."""

import collections
import logging
import sys
import types
from functools import partial

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy

from tests.unit.test_float8_backward import llama_float8
from torchtitan.config import ConfigError, Float8, parse_args
from torchtitan.float8.convert import (
    apply_float8,
    check_float8,
    float8_device_problem,
    import_torchao_float8,
    is_float8_linear,
    recompute_must_round_like_forward,
)
from torchtitan.metrics import MetricsLogger, StepStats
from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.models.llama3.parallelize import LLAMA3
from torchtitan.parallel.activation_checkpoint import _ops_to_save, _selective_policy, apply_ac

aten = torch.ops.aten
LINEARS_PER_BLOCK = 7
EMULATED = dict(enable=True, emulate=True)


def meta_model(flavor: str = "debugmodel", **overrides) -> Transformer:
    with torch.device("meta"):
        return Transformer(get_model_args(flavor, max_seq_len=32, **overrides))


def cpu_model(shape: dict | None = None, **float8) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(get_model_args("debugmodel", max_seq_len=32, **(shape or {})))
    model.init_weights()
    if float8:
        llama_float8(model, Float8(**float8))
    return model


# --------------------------------------------------------------------------- config and checks


def test_config_parses_and_suggests():
    args = ["--float8.enable", "--float8.recipe", "rowwise", "--float8.filter_fqns=wo,w2"]
    cfg = parse_args(args)
    want = (True, "rowwise", ["wo", "w2"])
    assert (cfg.float8.enable, cfg.float8.recipe, cfg.float8.filter_fqns) == want
    assert Float8().filter_fqns == []  # the model family keeps its head (Llama: "output")
    assert LLAMA3.float8_exclude == ("output",)
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
    conversion = llama_float8(model := meta_model(), Float8(**EMULATED))
    assert len(conversion.converted) == LINEARS_PER_BLOCK * model.args.n_layers
    assert conversion.skipped == {"output": "the model keeps it"}
    assert not is_float8_linear(model.output)
    assert all(is_float8_linear(model.layers[i].feed_forward.w2) for i in model.layers)


def test_filter_fqns_keep_more_linears_in_high_precision():
    cfg = Float8(**EMULATED, filter_fqns=["attention.wo"])
    conversion = llama_float8(model := meta_model(), cfg)
    assert len(conversion.converted) == (LINEARS_PER_BLOCK - 1) * model.args.n_layers
    assert conversion.skipped["layers.0.attention.wo"] == "filter_fqns"
    assert conversion.skipped["output"] == "the model keeps it"


def test_dims_not_divisible_by_16_are_skipped_and_listed_once(caplog):
    model = meta_model(multiple_of=2)  # SwiGLU hidden 682: w1, w2, w3 cannot be float8
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        conversion = llama_float8(model, Float8(**EMULATED))
    assert len(conversion.converted) == 4 * model.args.n_layers
    assert conversion.skipped["layers.5.feed_forward.w2"] == "682->256: dims not divisible by 16"
    (line,) = [r.getMessage() for r in caplog.records if "float8 (" in r.getMessage()]
    assert "layers.*.feed_forward.w1 (256->682: dims not divisible by 16)" in line
    assert "output (the model keeps it)" in line
    assert "layers.0" not in line and line.count("w2") == 1


class LinearWithItsOwnForward(nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


def test_a_linear_with_its_own_forward_stays_in_high_precision():
    """A float8 swap replaces the class, so a subclass's own forward would be dropped."""
    model = meta_model()
    with torch.device("meta"):
        model.output = LinearWithItsOwnForward(model.args.dim, model.args.vocab_size, bias=False)
    conversion = apply_float8(model, Float8(**EMULATED))
    assert conversion.skipped == {"output": "a LinearWithItsOwnForward, not a plain nn.Linear"}
    assert type(model.output) is LinearWithItsOwnForward


def test_nothing_converted_warns(caplog):
    cfg = Float8(enable=True, filter_fqns=["attention", "feed_forward"])
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        assert llama_float8(meta_model(), cfg).converted == []
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
    float8 = Float8(enable=True, recipe=recipe, emulate=emulate)
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
    emulated = linear_run(Float8(enable=True, emulate=True))
    kernel = linear_run(Float8(enable=True, emulate=False))
    for a, b in zip(emulated, kernel):
        assert relative_error(a, b) < 1e-6


# --------------------------------------------------------------------------- selective AC


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func] += 1
        return func(*args, **(kwargs or {}))


# Two narrow blocks: the counts follow the block's structure, not its width, and torch's CPU
# _scaled_mm is a slow reference kernel (about 0.2 s for a 64 x 256 x 768 matmul).
NARROW = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=1)


def backward_ops(mode: str, save_matmuls: str = "all", emulate: bool = False):
    """How often each aten op runs in the backward of the narrow model under AC ``mode``."""
    model = cpu_model(NARROW, enable=True, emulate=emulate)
    apply_ac(model, mode, "op", save_matmuls=save_matmuls)
    loss = model(torch.randint(model.args.vocab_size, (2, 32))).float().square().mean()
    with CountOps() as counter:
        loss.backward()
    return counter.counts


@pytest.mark.parametrize("emulate", [True, pytest.param(False, marks=needs_cpu_scaled_mm)])
def test_selective_op_keeps_float8_matmuls_and_amax_outputs(emulate):
    """SAC sees torchao's float8 matmul as aten.mm on float8 tensors (the _scaled_mm runs inside
    the tensor subclass; the same under compile) and the casts' amax as aten.max."""
    n_layers = NARROW["n_layers"]
    mm, amax = aten.mm.default, aten.max.default
    no_ac = backward_ops("none", emulate=emulate)
    assert no_ac[mm] == 2 * LINEARS_PER_BLOCK * n_layers + 2
    selective = backward_ops("selective", emulate=emulate)
    assert selective[mm] == no_ac[mm]
    assert backward_ops("selective", "alternate", emulate=emulate)[mm] == no_ac[mm] + 3 * n_layers
    # backward computes the amax of its own casts only: the forward's are kept
    assert selective[amax] == no_ac[amax] > 0
    assert backward_ops("full", emulate=emulate)[amax] > no_ac[amax]


def test_scaled_mm_counts_as_a_matmul_for_alternate():
    """Where the float8 kernel itself reaches the policy, it is saved like any matmul (every
    other one with save_matmuls=alternate), and so are amax reductions."""
    ctx = types.SimpleNamespace(is_recompute=False)
    counts = {"forward": 0, "recompute": 0}
    policy = partial(_selective_policy, _ops_to_save(), True, counts)
    decisions = [policy(ctx, op) for op in [aten._scaled_mm.default, aten.mm.default] * 2]
    assert decisions == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE] * 2
    assert policy(ctx, aten.max.default) == CheckpointPolicy.MUST_SAVE


# --------------------------------------------------------------------------- metrics


def test_mfu_is_labelled_with_its_bf16_basis(monkeypatch, caplog):
    import torchtitan.metrics as metrics

    monkeypatch.setattr(metrics, "peak_flops", lambda device: 1e12)
    logger = MetricsLogger(torch.device("cpu"), 10**9, 10, 1, enabled=True, float8=True)
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        got = logger.record(StepStats(1, 2.0, 1.0, 1e-3, 1000, 0.0))
    assert "mfu_bf16_peak_pct" in got and "mfu_pct" not in got
    assert "mfu(bf16 peak)" in caplog.records[-1].getMessage()
