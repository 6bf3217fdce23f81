"""The step model (torchtitan/planning): hand-computed accounting, invariants, calibration."""

import dataclasses

import pytest
import torch
import torch.nn as nn

from torchtitan.config import Float8, parse_args
from torchtitan.float8.convert import skip_reason
from torchtitan.models import family_of
from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.planning import calibration as cal
from torchtitan.planning.activations import (
    block_bytes_per_token,
    block_fixed_bytes,
    loss_peak_bytes_per_token,
)
from torchtitan.planning.compare import (
    _old_code_bytes,
    _old_code_workload,
    compare_point,
    load_points,
)
from torchtitan.planning.float8 import Float8Setting, converted_linears
from torchtitan.planning.hardware import make_hardware
from torchtitan.planning.layout import Layout, Workload
from torchtitan.planning.memory import _rank_memory, estimate_memory, param_counts, rank_params
from torchtitan.planning.schedules import inflight_chunks, rank_stages
from torchtitan.planning.search import search
from torchtitan.planning.shapes import shapes
from torchtitan.planning.timing import estimate_time

DEBUG = get_model_args("debugmodel")  # dim 256, 6 layers, 16/4 heads, ffn 768, vocab 4096
KIB = 1024
LLAMA_EXCLUDE = family_of("llama3").float8_exclude  # the head


def workload(flavor="debugmodel", seq_len=2048, **kw) -> Workload:
    return Workload(get_model_args(flavor, max_seq_len=seq_len), seq_len, **kw)


# ------------------------------------------------------------------- accounting by hand


def test_debug_model_parameter_and_state_bytes():
    # block: wq, wo 256x256; wk, wv 256x64; w1, w2, w3 256x768; two norms of 256
    block = 2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 768 + 2 * 256
    assert param_counts(DEBUG, 1).block == block == 754_176
    full = rank_params(DEBUG, 1, rank_stages(workload(), Layout())[0])
    assert full == DEBUG.num_params() == 6 * block + 4096 * 256 * 2 + 256
    mem = estimate_memory(workload(), Layout(dp_shard=2)).parts
    assert mem["weights (fp32)"] == 4 * full / 2
    assert mem["optimizer state"] == 8 * full / 2  # AdamW: two fp32 states
    assert mem["gradients"] == 0  # set to None after every step, not alive at the peak


def test_debug_model_activation_bytes_per_ac_mode():
    # bf16, per token: x, norm, q, attention out, h, norm (6 x 256), k, v (2 x 64), w1, w3 and
    # w2's input (3 x 768); fp32 logsumexp per head (16) and two 1/RMS values.
    none = 2 * (6 * 256 + 2 * 64 + 3 * 768) + 4 * 16 + 2 * 4
    selective = 2 * (4 * 256 + 2 * 64 + 2 * 768) + 4 * 16  # x, q, k, v, attn, wo, w1, w3
    alternate = 2 * (3 * 256 + 64 + 768) + 4 * 16  # x, q, v, attn, w1
    assert block_bytes_per_token(DEBUG, "none") == none == 8008
    assert block_bytes_per_token(DEBUG, "all") == selective
    assert block_bytes_per_token(DEBUG, "alternate") == alternate
    assert block_bytes_per_token(DEBUG, "full") == 2 * 256
    layout = Layout(dp_shard=2, local_batch_size=3, ac_mode="selective", save_matmuls="alternate")
    activations = estimate_memory(workload(), layout).parts["activations"]
    assert activations == 6 * alternate * 3 * 2048


@pytest.mark.parametrize(
    "flavor, measured",
    [("1B", (74.13, 50.12, 29.12, 4.0)), ("8B", (136.13, 92.12, 54.12, 8.0))],
)
def test_block_bytes_reproduce_the_gpu_measurement(flavor, measured):
    """KiB/token/block of compiled bf16 blocks on an H100 (planning/measure.py, docs)."""
    model = get_model_args(flavor)
    for kind, kib in zip(("none", "all", "alternate", "full"), measured):
        assert block_bytes_per_token(model, kind) / KIB == pytest.approx(kib, abs=0.01)


def test_loss_bytes():
    model = get_model_args("8B")
    eager = loss_peak_bytes_per_token(model, "eager")
    assert eager == 14 * 128256 + 8 * 4096  # bf16 logits + fp32 copy, its softmax, gradients
    assert loss_peak_bytes_per_token(model, "compiled") == 4 * 128256 + 8 * 4096
    # In place: the gradient overwrites the logits, in bf16 and in fp32.
    assert loss_peak_bytes_per_token(model, "in_place") == 2 * 128256 + 8 * 4096
    assert loss_peak_bytes_per_token(model, "in_place", bf16=False) == 4 * 128256 + 8 * 4096
    assert loss_peak_bytes_per_token(model, "eager", vocab_shards=2) < eager


def test_fsdp_keeps_the_head_and_one_block_gathered_at_the_peak():
    """Every block reshards after forward, the last one too: the head group stays gathered, and
    the last block is prefetched for its backward; older code's extra block is the points'
    last_block_gathered adjustment (0.41 GiB for 8B)."""
    work, layout = workload("8B", seq_len=8192), Layout(dp_shard=4, ac_mode="selective")
    counts = param_counts(work.model, 1)
    parts = estimate_memory(work, layout).parts
    assert parts["bf16 weight copies"] == 2 * counts.head + 2 * counts.block
    adjustment = _old_code_bytes({"last_block_gathered": True}, work, layout)
    assert adjustment == pytest.approx(2 * counts.block * 1.035)
    assert adjustment / 2**30 == pytest.approx(0.42, abs=0.005)
    assert _old_code_bytes({"last_block_gathered": True}, work, Layout(ac_mode="none")) == 0


def test_a_row_sharded_embedding_is_neither_gathered_nor_carried_unsharded():
    """Under PP x FSDP the first stage's rank held the gathered bf16 table and its unsharded
    fp32 gradient across microbatches; looked up where its rows live, it holds a shard of the
    gradient. Nothing changes under TP (the trainer leaves TP's embedding to FSDP) or where the
    table is not the first stage's. The switch is off by default."""
    assert not Workload.from_config(parse_args([])).sharded_embedding
    work = workload("8B", seq_len=8192, sharded_embedding=True)
    gathered = work.with_(sharded_embedding=False)
    pp = Layout(dp_shard=2, pp=2, local_batch_size=8, pp_schedule="Interleaved1F1B")
    assert work.embedding_rows_sharded(pp) and not gathered.embedding_rows_sharded(pp)
    emb = param_counts(work.model, 1).embedding
    stage0 = rank_stages(work, pp)[0]
    assert stage0.embedding
    parts, before = _rank_memory(work, pp, stage0).parts, _rank_memory(gathered, pp, stage0).parts
    assert before["gradients"] - parts["gradients"] == pytest.approx(4 * emb - 4 * emb / 2)
    assert before["bf16 weight copies"] - parts["bf16 weight copies"] == pytest.approx(2 * emb)
    # The largest group FSDP's streams keep is now a block (or the head, on the last stage).
    assert parts["communication buffers"] < before["communication buffers"]
    assert estimate_memory(work, pp).total < estimate_memory(gathered, pp).total
    stage1 = rank_stages(work, pp)[1]
    assert not stage1.embedding
    assert _rank_memory(work, pp, stage1).total == _rank_memory(gathered, pp, stage1).total
    tp = Layout(dp_shard=2, tp=2, ac_mode="selective")
    assert not work.embedding_rows_sharded(tp)
    assert estimate_memory(work, tp).total == estimate_memory(gathered, tp).total
    assert not work.embedding_rows_sharded(Layout(dp_replicate=4))  # DDP: nothing to shard
    hw = make_hardware(4, 1, "H200")
    fsdp = Layout(dp_shard=4, ac_mode="selective")
    faster = estimate_time(work, fsdp, hw).tokens_per_second_per_gpu
    assert faster > estimate_time(gathered, fsdp, hw).tokens_per_second_per_gpu


# ------------------------------------------------------------------------------ float8


def _trainer_converted(flavor: str, cfg: Float8) -> set[str]:
    """What the trainer's apply_float8 would convert: skip_reason on the real modules, with the
    Llama family's exclusions."""
    with torch.device("meta"):
        model = Transformer(get_model_args(flavor))
    names = set()
    for fqn, module in model.named_modules():
        if isinstance(module, nn.Linear) and (fqn == "output" or fqn.startswith("layers.0.")):
            if skip_reason(fqn, module, cfg, LLAMA_EXCLUDE) is None:
                names.add(fqn.rsplit(".", 1)[-1])
    return names


@pytest.mark.parametrize(
    "flavor, options, expected",
    [
        ("8B", {}, {"wq", "wk", "wv", "wo", "w1", "w2", "w3"}),  # the model keeps the head
        ("8B", {"filter_fqns": ["wk", "wv"]}, {"wq", "wo", "w1", "w2", "w3"}),
        ("1B", {"recipe": "rowwise", "filter_fqns": ["attention"]}, {"w1", "w2", "w3"}),
        ("debugmodel", {}, {"wq", "wk", "wv", "wo", "w1", "w2", "w3"}),
    ],
)
def test_float8_linears_follow_the_trainers_rule(flavor, options, expected):
    cfg = Float8(enable=True, **options)
    setting = Float8Setting.from_config(cfg, LLAMA_EXCLUDE)
    planned = converted_linears(setting, shapes(get_model_args(flavor)))
    assert planned == expected == _trainer_converted(flavor, cfg)
    assert Float8Setting.from_config(Float8(), LLAMA_EXCLUDE) is None
    # The planner reads the family of --model.name.
    work = Workload.from_config(parse_args(["--float8.enable", "--model.flavor", flavor]))
    assert work.float8.model_exclude == LLAMA_EXCLUDE


def test_float8_linears_skip_dims_float8_cannot_take():
    """A linear whose dims are not divisible by 16 stays in bf16, in the trainer and the plan."""
    cfg = Float8(enable=True)
    model = dataclasses.replace(shapes(DEBUG), ffn=760)  # w1, w3: 256->760; w2: 760->256
    planned = converted_linears(Float8Setting.from_config(cfg, LLAMA_EXCLUDE), model)
    assert planned == {"wq", "wk", "wv", "wo"}


def test_float8_activation_and_weight_bytes():
    """Compiled AC-off blocks recompute what only float8 linears use (CPU measurement, docs):
    the ffn norm output (w1, w3) and w2's input; the attention norm output too when wq, wk
    and wv are all float8. Selective AC, eager blocks and TP keep the bf16 bytes."""
    model, kib = get_model_args("1B"), 1024
    default, every = {"wq", "wo", "w1", "w2", "w3"}, {"wq", "wk", "wv", "wo", "w1", "w2", "w3"}
    none = block_bytes_per_token(model, "none")
    f8 = block_bytes_per_token(model, "none", float8=frozenset(default))
    assert (none - f8) / kib == 20 and f8 / kib == pytest.approx(54.13, abs=0.01)
    assert block_bytes_per_token(model, "none", float8=frozenset(every)) / kib == pytest.approx(
        50.13, abs=0.01
    )
    for kwargs in ({"compiled": False}, {"tp": 2}):
        assert block_bytes_per_token(
            model, "none", float8=frozenset(every), **kwargs
        ) == block_bytes_per_token(model, "none", **kwargs)
    for kind in ("all", "alternate", "full"):
        assert block_bytes_per_token(model, kind, float8=frozenset(every)) == (
            block_bytes_per_token(model, kind)
        )
    # Autocast keeps bf16 weight copies only of the bf16 linears (wk, wv: 2 x 2048 x 512).
    assert block_fixed_bytes(model, "none", True, float8=frozenset(default)) == 2 * (
        2 * 2048 * 512 + 2 * 2048
    )


def test_float8_all_gather_halves_the_gathered_float8_weights():
    base = workload("8B", seq_len=8192)
    gather = Float8Setting(fsdp_float8_all_gather=True)
    layout = Layout(dp_shard=4, ac_mode="selective")
    counts, linears = param_counts(base.model, 1), shapes(base.model).linears
    float8_weights = sum(linears[n] for n in ("wq", "wk", "wv", "wo", "w1", "w2", "w3"))
    copies = estimate_memory(base.with_(float8=gather), layout).parts["bf16 weight copies"]
    assert copies == 2 * counts.head + 2 * counts.block - float8_weights
    plain = estimate_memory(base.with_(float8=Float8Setting()), layout).parts
    assert plain["bf16 weight copies"] == 2 * counts.head + 2 * counts.block
    hw = make_hardware(4, card="H200")
    times = [estimate_time(base.with_(float8=s), layout, hw) for s in (None, gather)]
    assert times[1].tokens_per_second_per_gpu > times[0].tokens_per_second_per_gpu
    ddp = Layout(dp_replicate=4)  # FSDP does not shard: the trainer gathers nothing in float8
    assert base.with_(float8=gather).float8_gathered(ddp) == frozenset()


# ------------------------------------------------------------------------------ invariants


@pytest.mark.parametrize("flavor", ["debugmodel", "1B", "8B"])
def test_ac_modes_order_activation_memory(flavor):
    work = workload(flavor, seq_len=4096)
    acts = [
        estimate_memory(work, Layout(dp_shard=4, ac_mode=m, save_matmuls=s)).parts["activations"]
        for m, s in [
            ("none", "all"),
            ("selective", "all"),
            ("selective", "alternate"),
            ("full", "all"),
        ]
    ]
    assert acts == sorted(acts, reverse=True) and len(set(acts)) == 4


@pytest.mark.parametrize("ac", ["none", "selective", "full"])
def test_more_sharding_never_raises_memory(ac):
    work = workload("8B", seq_len=8192)
    totals = [estimate_memory(work, Layout(dp_shard=n, ac_mode=ac)).total for n in (2, 4, 8, 16)]
    assert totals == sorted(totals, reverse=True)


@pytest.mark.parametrize("dp_shard", [1, 2, 4])
def test_tensor_parallel_never_raises_per_gpu_memory(dp_shard):
    work = workload("8B", seq_len=8192)
    for ac in ("none", "selective", "full"):
        totals = [
            estimate_memory(work, Layout(dp_shard=dp_shard, tp=tp, ac_mode=ac)).total
            for tp in (1, 2, 4, 8)
        ]
        assert totals == sorted(totals, reverse=True), ac


@pytest.mark.parametrize(
    "pp, schedule, per_rank",
    [
        (2, "1F1B", 0),
        (4, "Interleaved1F1B", 0),
        (4, "LoopedBFS", 4),
        (2, "ZBVZeroBubble", 0),
        (8, "DualPipeV", 0),
    ],
)
def test_pipeline_ranks_hold_the_whole_model_once(pp, schedule, per_rank):
    work = workload("8B", seq_len=8192)
    model = work.model
    layout = Layout(pp=pp, pp_schedule=schedule, pp_stages_per_rank=per_rank)
    ranks = rank_stages(work, layout)
    assert sum(rank_params(model, 1, r) for r in ranks) == model.num_params()
    assert sum(r.embedding for r in ranks) == sum(r.head for r in ranks) == 1


@pytest.mark.parametrize(
    "schedule, pp, n_mb, v",
    [
        ("Interleaved1F1B", 2, 8, 2),
        ("Interleaved1F1B", 4, 8, 2),
        ("Interleaved1F1B", 8, 8, 2),
        ("InterleavedZeroBubble", 4, 8, 2),
    ],
)
def test_inflight_chunks_follow_torch_schedules(schedule, pp, n_mb, v):
    """Forwards alive before each backward in torch's own op order, for every rank."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = getattr(schedules, f"Schedule{schedule}")
    layout = Layout(pp=pp, local_batch_size=n_mb, pp_schedule=schedule)
    for rank in range(pp):
        sched = cls.__new__(cls)
        sched.pp_group_size, sched.n_local_stages, sched.rank = pp, v, rank
        sched._n_microbatches = n_mb
        sched.number_of_rounds = max(1, n_mb // pp)
        sched.microbatches_per_round = n_mb // sched.number_of_rounds
        alive = peak = 0
        for action in sched._calculate_single_rank_operations(rank):
            if action is not None:
                alive += {"F": 1, "B": -1, "I": -1}.get(action.computation_type.value, 0)
                peak = max(peak, alive)
        assert inflight_chunks(layout, rank, v) == peak, rank


def test_recompute_costs_time_and_bubbles_shrink_with_microbatches():
    work, hw = workload("8B", seq_len=8192), make_hardware(4, card="H200")
    tps = {
        m: estimate_time(work, Layout(dp_shard=4, ac_mode=m), hw).tokens_per_second_per_gpu
        for m in ("none", "full")
    }
    assert tps["full"] < tps["none"]
    pp = [
        estimate_time(work, Layout(pp=2, dp_shard=2, local_batch_size=n), hw).parts for n in (2, 8)
    ]
    assert pp[1]["pipeline bubble"] / pp[1]["compute"] < pp[0]["pipeline bubble"] / pp[0]["compute"]


def test_the_copy_engine_all_gather_is_estimated_where_the_trainer_takes_it():
    """--experimental.fsdp_copy_engine_all_gather (off by default): COPY_ENGINE_GAIN on the step
    where FSDP shards within one node without PP (TP allowed); nothing where it is off, across
    nodes, under PP or without FSDP sharding."""
    hw = make_hardware(4, card="H200")

    def tps(layout, **kw):
        work = workload("8B", seq_len=8192, **kw)
        return estimate_time(work, layout, hw).tokens_per_second_per_gpu

    fsdp4, fsdp2_tp2 = Layout(dp_shard=4), Layout(dp_shard=2, tp=2)
    assert tps(fsdp4, copy_engine_all_gather=True) / tps(fsdp4) == pytest.approx(
        cal.COPY_ENGINE_GAIN
    )
    assert tps(fsdp2_tp2, copy_engine_all_gather=True) > tps(fsdp2_tp2)
    on = workload("8B", seq_len=8192, copy_engine_all_gather=True)
    assert on.gathers_on_copy_engines(Layout(dp_shard=4), gpus_per_node=4)
    assert not on.gathers_on_copy_engines(Layout(dp_shard=8), gpus_per_node=4)  # two nodes
    assert not on.gathers_on_copy_engines(Layout(dp_shard=2, tp=4), gpus_per_node=4)  # span 5
    assert not on.gathers_on_copy_engines(Layout(dp_shard=2, pp=2), gpus_per_node=4)
    assert not on.gathers_on_copy_engines(Layout(dp_replicate=4), gpus_per_node=4)  # DDP
    cfg = parse_args(["--experimental.fsdp_copy_engine_all_gather"])
    assert Workload.from_config(cfg).copy_engine_all_gather
    assert not Workload.from_config(parse_args([])).copy_engine_all_gather


def test_the_one_kernel_all_gather_cast_is_estimated_where_the_trainer_uses_it():
    """FLOAT8_ALL_GATHER_CAST_GAIN on the step where FSDP all-gathers float8 weights with
    precomputed scales (the trainer then casts each shard in our one kernel); not on one GPU,
    not without precomputed scales, and not for the measured points of older code that cast
    with torchao's kernels (their torchao_all_gather_cast marker)."""
    hw = make_hardware(4, card="H200")
    on = Float8(enable=True, fsdp_float8_all_gather=True, precompute_scales=True)
    unscaled = dataclasses.replace(on, precompute_scales=False)

    def tps(layout, cfg, point=None):
        work = workload("8B", seq_len=8192, float8=Float8Setting.from_config(cfg, LLAMA_EXCLUDE))
        work = _old_code_workload(point or {}, work)
        return estimate_time(work, layout, hw).tokens_per_second_per_gpu

    fsdp4, one = Layout(dp_shard=4), Layout()
    gain = tps(fsdp4, on) / tps(fsdp4, unscaled)
    assert gain == pytest.approx(cal.FLOAT8_ALL_GATHER_CAST_GAIN)
    assert tps(one, on) == tps(one, unscaled)
    assert tps(fsdp4, on, {"torchao_all_gather_cast": True}) == tps(fsdp4, unscaled)


def test_older_float8_code_of_measured_points_is_estimated_as_it_ran():
    """The trainer runs our tensorwise and rowwise backwards, and scales each TP shard of a
    tensorwise linear on its own; the measured points of older code that ran torchao's backward
    or all-reduced the amax under TP are estimated with it: rowwise loses
    FLOAT8_ROWWISE_OWN_BACKWARD_GAIN on its linears' time, tensorwise its measured share
    (smaller without AC), under TP FLOAT8_SPEED_UNDER_TP (which rowwise always has). Each step
    loses less than its linears (attention, head, optimizer stay); rowwise_with_gw_hp runs
    torchao's backward today."""
    hw = make_hardware(4, card="H200")

    def tps(recipe: str, point: dict, ac_mode: str = "none", tp: int = 1):
        cfg = Float8(enable=True, recipe=recipe)
        work = workload("8B", seq_len=8192, float8=Float8Setting.from_config(cfg, LLAMA_EXCLUDE))
        layout = Layout(dp_shard=4 // tp, tp=tp, ac_mode=ac_mode)
        return estimate_time(_old_code_workload(point, work), layout, hw).tokens_per_second_per_gpu

    torchao = {"torchao_float8_backward": True}
    gain = tps("rowwise", {}) / tps("rowwise", torchao)
    assert 1.05 < gain < cal.FLOAT8_ROWWISE_OWN_BACKWARD_GAIN
    share = cal.FLOAT8_TORCHAO_TENSORWISE_BACKWARD_SPEED
    for ac_mode, torchao_share in (("none", share["none"]), ("selective", share["checkpointed"])):
        gain = tps("tensorwise", {}, ac_mode) / tps("tensorwise", torchao, ac_mode)
        assert 1 < gain < 1 / torchao_share
    assert tps("tensorwise", {}) / tps("tensorwise", torchao) > 1.05
    assert tps("rowwise_with_gw_hp", {}) == tps("rowwise_with_gw_hp", torchao)
    amax = {"float8_tp_amax_all_reduce": True}
    assert tps("tensorwise", {}, tp=2) > tps("tensorwise", amax, tp=2)
    assert tps("tensorwise", amax, tp=2) == tps("rowwise", {}, tp=2) == tps("rowwise", amax, tp=2)
    assert cal.FLOAT8_SPEED_UNDER_TP < 1 < cal.FLOAT8_SPEED_UNDER_TP_SHARD_SCALES


# ------------------------------------------------------------------------ calibration


@pytest.mark.parametrize("point", load_points(), ids=lambda p: p["name"])
def test_calibrated_points_within_targets(point):
    """Estimates against the measured steps of tests/unit/data/planning_measured.toml."""
    row = compare_point(point)
    assert abs(row.memory_error) <= row.memory_tolerance, f"memory {row.memory_error:+.1%}"
    assert abs(row.tokens_error) <= row.tokens_tolerance, f"tokens/s {row.tokens_error:+.1%}"


def test_superseded_points_are_labelled_and_every_point_names_its_card_and_code():
    for point in load_points() + load_points(superseded=True):
        assert point["card"] in ("H100", "H200") and point["code"] and point["source"]
    assert all(p["superseded"] for p in load_points(superseded=True))


EXPERIMENTAL_GATHERS = ["--experimental.fsdp_copy_engine_all_gather"]
EXPERIMENTAL_GATHERS += ["--experimental.fsdp_sharded_embedding"]


@pytest.mark.parametrize("experimental", [[], EXPERIMENTAL_GATHERS], ids=["default", "switches"])
def test_top_pick_for_8b_on_4_h200_is_near_the_best_measured_layout(experimental):
    """The planner's pick for the 8B config on 4x H200 (bf16) against the fastest layout
    measured with the same switches at the config's global batch (4 samples, which the planner
    keeps): FSDP4 without AC, 9,678 tokens/s/GPU with NCCL's all-gather, 9,995 with the copy
    engines and the row-sharded embedding."""
    measured = [
        p
        for p in load_points()
        if p["card"] == "H200"
        and p["gpus"] == 4
        and "--model.flavor 8B --training.seq_len 8192 --training.local_batch_size 1" in p["args"]
        and "--float8.enable" not in p["args"]
        and all(flag in p["args"] for flag in experimental)
        and ("--experimental." in p["args"]) == bool(experimental)
    ]
    best = max(measured, key=lambda p: p["tokens_per_second"])
    assert best["tokens_per_second"] == (9995 if experimental else 9678)
    cfg = parse_args(["--job.config_file", "train_configs/llama3_8b.toml", *experimental])
    hw = make_hardware(4, card="H200")
    plan = search(cfg, Workload.from_config(cfg).with_(compile=True, compile_loss=True), hw)
    top = plan.fits[0]
    assert top.layout.describe() == "FSDP4"
    assert abs(top.tokens_per_second / best["tokens_per_second"] - 1) <= 0.05


def test_float8_plan_ranks_float8_layouts_faster():
    cfg = parse_args(["--job.config_file", "train_configs/llama3_8b.toml", "--float8.enable"])
    hw = make_hardware(4, card="H200")
    work = Workload.from_config(cfg).with_(compile=True, compile_loss=True)
    float8 = search(cfg, work, hw).fits[0]
    bf16 = search(cfg, work.with_(float8=None), hw).fits[0]
    assert float8.layout == bf16.layout
    assert 1.1 < float8.tokens_per_second / bf16.tokens_per_second < 1.4


def test_rowwise_float8_plans_may_use_the_selective_op_policy():
    """Rowwise float8 + compile + selective-op AC trains (eager rounding, float8/convert.py),
    so the planner considers it like any other recipe."""
    cfg = parse_args(
        ["--job.config_file", "train_configs/llama3_8b.toml", "--float8.enable"]
        + ["--float8.recipe", "rowwise"]
    )
    plan = search(cfg, Workload.from_config(cfg), make_hardware(4, card="H200"))
    selective_op = [
        c for c in plan.fits if (c.layout.ac_mode, c.layout.ac_option) == ("selective", "op")
    ]
    assert selective_op
    assert not [c for c in plan.rejected if "activation checkpointing" in c.reason]


def test_search_keeps_the_global_batch_and_the_trainers_checks():
    cfg = parse_args(["--training.global_batch_size", "16", "--training.seq_len", "512"])
    plan = search(cfg, Workload.from_config(cfg), make_hardware(8, card="H100"))
    assert plan.fits and plan.rejected
    for c in plan.fits:
        lay = c.layout
        assert 16 % (lay.local_batch_size * lay.dp_degree) == 0
    reasons = " ".join(c.reason for c in plan.rejected)
    assert "tensor_parallel_degree=8 must divide n_heads=16 and n_kv_heads=4" in reasons
    assert "compiled stages" in reasons  # zero-bubble schedules with the recommended compile


def test_layout_round_trips_through_the_config():
    layout = Layout(
        dp_replicate=2,
        dp_shard=2,
        tp=2,
        pp=2,
        local_batch_size=4,
        pp_schedule="Interleaved1F1B",
        ac_mode="selective",
        save_matmuls="alternate",
    )
    cfg = layout.apply_to(parse_args([]))
    assert Layout.from_config(cfg, 16) == layout
    assert dataclasses.replace(layout, dp_shard=4).world_size == 32


def test_workload_uses_the_trainers_model_shape():
    """The planner plans the model the trainer builds: the flavor with the [model] overrides."""
    cfg = parse_args(["--model.flavor=8B", "--model.n_layers=4", "--model.vocab_size=32768"])
    work = Workload.from_config(cfg)
    assert (work.model.n_layers, work.model.vocab_size, work.model.dim) == (4, 32768, 4096)
    assert work.model.num_params() < get_model_args("8B").num_params() / 4


def test_workload_rejects_a_bad_shape_in_one_line():
    from torchtitan.config import ConfigError

    with pytest.raises(ConfigError, match="must be divisible by model.n_heads"):
        Workload.from_config(parse_args(["--model.n_heads=7"]))
