"""The step model (torchtitan/planning) on Mixture-of-Experts models: total parameters in memory,
active ones in compute, expert parallelism's sharding and token exchange."""

import dataclasses
import shlex
from types import SimpleNamespace

import pytest
import torch

from torchtitan.config import ConfigError, parse_args
from torchtitan.models.llama3 import get_model_args as llama_args
from torchtitan.models.qwen3.flavors import get_model_args
from torchtitan.plan import run as plan_run
from torchtitan.planning import calibration as cal
from torchtitan.planning.activations import block_bytes_per_token
from torchtitan.planning.command import planned_config, run_train_command
from torchtitan.planning.fit import job_estimate
from torchtitan.planning.hardware import make_hardware
from torchtitan.planning.layout import Layout, Workload
from torchtitan.planning.memory import estimate_memory, stored_params
from torchtitan.planning.schedules import rank_stages
from torchtitan.planning.search import expert_degrees
from torchtitan.planning.shapes import shapes
from torchtitan.planning.timing import estimate_time
from torchtitan.preflight import main as preflight

QWEN3 = ["--model.name", "qwen3", "--model.flavor"]
H100X8 = make_hardware(8, card="H100")


def workload(flavor="30B-A3B", seq_len=2048, **kw) -> Workload:
    return Workload(get_model_args(flavor, max_seq_len=seq_len), seq_len, **kw)


def planner_params(model) -> int:
    """The model's parameters as the planner counts them: without Qwen3's per-head q/k norm
    weights (2 x head_dim per block)."""
    return model.num_params() - model.n_layers * 2 * model.head_dim


# ------------------------------------------------------------------------------ memory


def test_memory_holds_every_expert_in_weights_gradients_and_adam():
    work = workload(global_batch_size=16)  # 8 ranks x batch 1: two accumulated micro-steps
    total = planner_params(work.model)
    assert total == pytest.approx(30.5e9, rel=0.01)
    s = work.shape
    assert s.moe_params == 128 * 3 * 2048 * 768 + 2048 * 128  # routed experts + router gate
    assert s.moe_active_params == 8 * 3 * 2048 * 768 + 2048 * 128
    for layout in (Layout(dp_shard=8), Layout(dp_shard=8, ep=8), Layout(dp_shard=4, tp=2, ep=4)):
        parts = estimate_memory(work, layout).parts
        state = parts["weights (fp32)"] + parts["optimizer state"] + parts["gradients"]
        # fp32 weights, AdamW's two states and the accumulated fp32 gradients, of every expert:
        # TP does not split the experts, FSDP over the TP ranks does.
        assert state == pytest.approx((4 + 8 + 4) * total / 8, rel=0.002), layout


def test_experts_are_stored_over_dp_shard_cp_tp_and_gathered_per_ep_slice():
    work = workload()
    s, stages = work.shape, rank_stages(work, Layout())[0]
    moe_layers = s.n_layers * s.moe_params
    others = planner_params(work.model) - moe_layers
    for dp_shard, cp, tp, ep in ((8, 1, 1, 1), (8, 1, 1, 8), (4, 1, 2, 2), (2, 2, 2, 4)):
        layout = Layout(dp_shard=dp_shard, cp=cp, tp=tp, ep=ep)
        # ep x efsdp = dp_shard x cp x tp: whatever ep and tp, a rank stores 1/8 of the experts.
        expected = moe_layers / 8 + others / (dp_shard * cp * tp)
        assert stored_params(work, layout, stages) == pytest.approx(expected, rel=1e-3)
    gathered = []
    for ep in (1, 2, 4, 8):
        parts = estimate_memory(work, Layout(dp_shard=8, ep=ep, ac_mode="full")).parts
        assert parts["weights (fp32)"] == pytest.approx(4 * (moe_layers + others) / 8)
        gathered.append(parts["bf16 weight copies"] + parts["communication buffers"])
    # A rank gathers its ep slice of a layer's experts: the bf16 copies and FSDP's buffers
    # shrink with ep.
    assert gathered == sorted(gathered, reverse=True) and gathered[-1] < gathered[0] / 1.5


def test_moe_activation_bytes_per_ac_mode():
    """debugmodel_moe (dim 256, 8 experts of hidden 128, top 2), per token, bf16."""
    moe = shapes(get_model_args("debugmodel_moe"))
    dense_twin = dataclasses.replace(moe, experts=0, top_k=0, expert_ffn=0)

    def moe_bytes(kind, ep=1):
        return block_bytes_per_token(moe, kind, ep=ep) - block_bytes_per_token(dense_twin, kind)

    # none: fp32 scores (8), indices + weights (2 x 18), gathered rows and down output
    # (2 x 2 x 256), w1, w3 outputs and their product (3 x 2 x 128).
    assert moe_bytes("none") == 4 * 8 + 2 * 18 + 2 * (2 * 2 * 256 + 3 * 2 * 128) == 3652
    assert moe_bytes("all") == 2 * (8 + 2 * 2 * 128 + 2 * 256)  # logits, w1, w3, w2 outputs
    assert moe_bytes("alternate") == 2 * (8 + 2 * 128)  # logits, w3's output
    assert moe_bytes("full") == 0  # the block input only, as a dense block
    # Expert parallel: the token exchanges' outputs are saved, not recomputed.
    assert moe_bytes("all", ep=2) == moe_bytes("all") + 2 * 2 * 256
    assert moe_bytes("alternate", ep=2) == moe_bytes("alternate") + 2 * 2 * 2 * 256
    assert moe_bytes("none", ep=2) == moe_bytes("none")


# ------------------------------------------------------------------------------ time


def test_compute_counts_the_active_parameters():
    """A MoE model and a dense one with as many active FFN weights compute as long; more
    experts at the same top_k cost memory, not compute."""
    moe_args = get_model_args("30B-A3B", max_seq_len=2048)
    ffn = round(shapes(moe_args).moe_active_params / (3 * 2048))
    dense_args = dataclasses.replace(moe_args, moe=None, ffn_hidden_dim=ffn)
    moe, dense = Workload(moe_args, 2048), Workload(dense_args, 2048)
    for layout in (Layout(dp_shard=8, ac_mode="selective"), Layout(dp_shard=8, ac_mode="full")):
        moe_time = estimate_time(moe, layout, H100X8)
        dense_time = estimate_time(dense, layout, H100X8)
        assert moe_time.parts["compute"] == pytest.approx(dense_time.parts["compute"], rel=0.005)
        assert moe_time.flops_per_token == pytest.approx(dense_time.flops_per_token, rel=0.005)
    wider = dataclasses.replace(moe_args, moe=dataclasses.replace(moe_args.moe, num_experts=256))
    wide = Workload(wider, 2048)
    layout = Layout(dp_shard=8, ep=8, ac_mode="full")
    compute = estimate_time(moe, layout, H100X8).parts["compute"]
    assert estimate_time(wide, layout, H100X8).parts["compute"] == pytest.approx(compute, rel=0.01)
    weights = estimate_memory(moe, layout).parts["weights (fp32)"]
    assert estimate_memory(wide, layout).parts["weights (fp32)"] > 1.8 * weights


@pytest.mark.parametrize(
    "dp_shard, tp, ac_mode, exchanges",
    [(8, 1, "selective", 4), (4, 2, "selective", 4), (8, 1, "full", 6)],
)
def test_all_to_all_volume(dp_shard, tp, ac_mode, exchanges):
    """Per MoE layer and microbatch: dispatch and combine, forward and backward (and the
    forward again under full AC), tokens_per_rank x top_k x dim bf16, (ep - 1) / ep of it."""
    work = workload(seq_len=4096, global_batch_size=32)
    micro_steps = 32 // (2 * dp_shard)  # local batch 2
    tokens = 2 * 4096 / tp  # the MoE layer runs on the TP sequence shard
    for ep in (1, 2, 4):
        layout = Layout(dp_shard=dp_shard, tp=tp, ep=ep, local_batch_size=2, ac_mode=ac_mode)
        time = estimate_time(work, layout, H100X8)
        one = tokens * 8 * 2048 * 2 * (ep - 1) / ep
        assert time.all_to_all_bytes == pytest.approx(micro_steps * 48 * exchanges * one)
        link = 450e9 * cal.LINK_EFFICIENCY  # NVLink: the ep ranks are within one node
        assert time.parts["expert all-to-all"] == pytest.approx(time.all_to_all_bytes / link)
    assert estimate_time(workload(), Layout(dp_shard=8), H100X8).all_to_all_bytes == 0


# ------------------------------------------------------------------------------ EP degrees


def test_expert_parallel_degrees_the_trainer_refuses_are_one_line_errors():
    moe = workload("debugmodel_moe")  # 8 experts
    cases = [
        (moe, Layout(dp_shard=3, ep=3), "must divide the 8 experts"),
        (moe, Layout(dp_shard=2, ep=4), "divide dp_shard x cp x tp = 2"),
        (Workload(llama_args("debugmodel"), 2048), Layout(dp_shard=2, ep=2), "needs a MoE"),
    ]
    for work, layout, expected in cases:
        for estimate in (estimate_memory, lambda w, lay: estimate_time(w, lay, H100X8)):
            with pytest.raises(ConfigError, match=expected) as error:
                estimate(work, layout)
            assert "\n" not in str(error.value)
    assert expert_degrees(8, 12) == [1, 2, 4]
    assert expert_degrees(128, 16) == [1, 2, 4, 8, 16]
    assert expert_degrees(0, 8) == [1]  # dense: no expert parallelism


# ------------------------------------------------------------------------------ CLI, preflight


def test_plan_of_a_moe_flavor_shows_parameters_and_the_all_to_all():
    text, plan = plan_run([*QWEN3, "debugmodel_moe", "--gpus", "4", "--card", "H100"])
    assert "parameters: 8.8M total, 5.3M active per token (8 experts, top 2" in text
    assert "expert all-to-all of #1: " in text
    assert {c.layout.ep for c in plan.fits} == {1, 2, 4}  # 4 ranks at most
    with_ep = next(c for c in plan.fits if c.layout.ep == 4)
    assert ",EP4" in with_ep.layout.describe()
    assert with_ep.time.all_to_all_bytes > 0
    # Its command runs expert parallelism: the trainer parses it back to the same layout.
    cfg = parse_args([*QWEN3, "debugmodel_moe"])
    job = planned_config(cfg, with_ep.layout, plan.global_batch)
    cmd = run_train_command(job, "", plan.hardware)
    assert "--parallelism.expert_parallel_degree 4" in cmd
    parsed = parse_args(shlex.split(cmd.split("./run_train.sh", 1)[1]))
    assert Layout.from_config(parsed, 4) == with_ep.layout


@pytest.fixture
def fake_h100(monkeypatch):
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=80 * 10**9)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setenv("WORLD_SIZE", "4")


def test_preflight_estimates_a_moe_job(capsys, fake_h100):
    job = [*QWEN3, "debugmodel_moe", "--parallelism.expert_parallel_degree", "4"]
    assert preflight(job) == 0
    assert "memory plan: ~" in capsys.readouterr().out
    big = parse_args([*QWEN3, "30B-A3B", "--activation_checkpoint.mode", "full"])
    with_ep = dataclasses.replace(
        big, parallelism=dataclasses.replace(big.parallelism, expert_parallel_degree=8)
    )
    assert job_estimate(with_ep, 8).total < job_estimate(big, 8).total
