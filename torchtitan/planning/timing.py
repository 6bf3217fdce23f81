"""Per-GPU step time of a layout: compute at an achievable share of the card's peak, the
communication that is not hidden behind it, the pipeline bubble and the optimizer step.

All times are seconds per optimizer step on the slowest pipeline rank.

MoE blocks (moe.py): their matmuls count the active weights (router, shared and top_k routed
experts), their weights move in their own FSDP groups, and with expert parallelism the token
exchange ("expert all-to-all") is exposed: the experts wait for their rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torchtitan.planning import calibration as cal
from torchtitan.planning import moe
from torchtitan.planning.activations import ac_kind
from torchtitan.planning.float8 import HEAD
from torchtitan.planning.hardware import Hardware
from torchtitan.planning.layout import Layout, Workload
from torchtitan.planning.memory import (
    param_counts,
    rank_gather_bytes,
    rank_params,
    stored_params,
)
from torchtitan.planning.schedules import RankStages, bubble_fraction, rank_stages
from torchtitan.planning.shapes import Shapes


@dataclass
class TimeEstimate:
    parts: dict[str, float] = field(default_factory=dict)  # seconds per step
    efficiency: float = 1.0  # calibrated end-to-end factor of the layout
    tokens_per_step: int = 0  # the whole job's
    world_size: int = 1
    flops_per_token: float = 0.0  # the trainer's formula (for MFU; active weights for MoE)
    peak_flops: float = 1.0
    all_to_all_bytes: float = 0.0  # expert parallel: bytes one GPU sends per step

    @property
    def step_seconds(self) -> float:
        return sum(self.parts.values()) / self.efficiency

    @property
    def tokens_per_second_per_gpu(self) -> float:
        return self.tokens_per_step / self.step_seconds / self.world_size

    @property
    def mfu(self) -> float:
        return self.flops_per_token * self.tokens_per_second_per_gpu / self.peak_flops


RECOMPUTED = {"none": (), "all": (), "alternate": ("wk", "wo", "w3")}


def _recomputed_share(model: Shapes, layout: Layout) -> tuple[dict[str, float], float]:
    """(share of each linear's forward FLOPs, share of attention's forward) that AC recomputes."""
    kind = ac_kind(layout.ac_mode, layout.save_matmuls)
    if layout.ac_mode == "selective" and layout.ac_option != "op":
        share = math.ceil(model.n_layers / int(layout.ac_option)) / model.n_layers
        return dict.fromkeys(model.linears, share), share
    if kind == "full":
        return dict.fromkeys(model.linears, 1.0), 1.0
    return {name: float(name in RECOMPUTED[kind]) for name in model.linears}, 0.0


def _float8_speedup(work: Workload, name: str, layout: Layout) -> float:
    """How much faster linear ``name``'s GEMMs run than in bf16, the cast overhead included:
    tensorwise at FLOAT8_MATMUL_SPEEDUP, rowwise at FLOAT8_ROWWISE_MATMUL_SPEEDUP times
    FLOAT8_ROWWISE_OWN_BACKWARD_GAIN (our backward), a float8 share below one for
    rowwise_with_gw_hp; under TP as measured there, by whether each TP shard is scaled on its
    own (calibration.py); torchao's tensorwise backward (measured points of older code only) at
    its measured share."""
    if name not in work.float8_linears:
        return 1.0
    setting = work.float8
    if layout.tp > 1:
        if setting.scales_tp_shards:
            return cal.FLOAT8_SPEED_UNDER_TP_SHARD_SCALES
        return cal.FLOAT8_SPEED_UNDER_TP
    if setting.recipe == "tensorwise":
        speedup = cal.FLOAT8_MATMUL_SPEEDUP
        if not setting.tensorwise_backward:
            ac = "none" if layout.ac_mode == "none" else "checkpointed"
            speedup *= cal.FLOAT8_TORCHAO_TENSORWISE_BACKWARD_SPEED[ac]
    else:
        speedup = cal.FLOAT8_ROWWISE_MATMUL_SPEEDUP
        if setting.rowwise_backward:
            speedup *= cal.FLOAT8_ROWWISE_OWN_BACKWARD_GAIN
    share = setting.float8_gemm_share
    return 1 / (share / speedup + 1 - share)


def _block_matmul_seconds(work: Workload, recomputed: dict, layout: Layout, peak: float) -> float:
    """Seconds per token of one block's projections: forward, backward (2x) and what AC
    recomputes, bf16 or float8."""
    seconds = 0.0
    for name, weights in work.shape.linears.items():
        flops = 2 * weights / layout.tp * (3 + recomputed[name])
        seconds += flops / (cal.MATMUL_EFFICIENCY * peak * _float8_speedup(work, name, layout))
    return seconds


def _compute_seconds(work: Workload, layout: Layout, hw: Hardware, stages: RankStages) -> float:
    """Matmuls, attention and the loss of one rank for one optimizer step."""
    model, peak = work.shape, hw.card.tflops * 1e12
    tokens = layout.local_batch_size * work.seq_len * work.accum_steps(layout) / layout.cp
    linear_shares, attn_share = _recomputed_share(model, layout)
    attn = 2 * work.seq_len * model.q / layout.tp  # causal forward
    blocks = stages.n_blocks * tokens
    seconds = blocks * _block_matmul_seconds(work, linear_shares, layout, peak)
    attn_eff = cal.attention_efficiency(model.head_dim, work.seq_len / layout.cp)
    seconds += blocks * attn * (3 + attn_share) / (attn_eff * peak)
    if model.experts:  # the MoE layer runs on the TP sequence shard, bf16 grouped GEMMs
        kind = ac_kind(layout.ac_mode, layout.save_matmuls)
        flops = moe.matmul_flops_per_token(model, kind, attn_share) / layout.tp
        seconds += blocks * flops / (cal.MATMUL_EFFICIENCY * peak)
    if stages.head:
        head_flops = tokens * 6 * model.vocab * model.dim / layout.tp
        head_speed = cal.MATMUL_EFFICIENCY * peak * _float8_speedup(work, HEAD, layout)
        seconds += head_flops / head_speed
        kind = work.loss_kind(layout)
        vocab = model.vocab / (layout.tp if work.loss_parallel else 1)
        traffic = cal.LOSS_TRAFFIC_BYTES_PER_VOCAB[kind] * vocab * tokens
        seconds += traffic / (hw.card.hbm_gbps * 1e9 * cal.HBM_EFFICIENCY)
    if not work.compile:
        seconds /= cal.EAGER_SLOWDOWN
    return seconds


def _ring_seconds(nbytes: float, group: int, gbps: float) -> float:
    """A ring all-gather / reduce-scatter of ``nbytes`` (the full tensor) over ``group`` ranks."""
    if group <= 1:
        return 0.0
    return nbytes * (group - 1) / group / (gbps * 1e9 * cal.LINK_EFFICIENCY)


def _moe_fsdp_seconds(work: Workload, layout: Layout, hw: Hardware, n_blocks: int) -> tuple:
    """(one all-gather, one reduce-scatter) of the MoE layers' weights over their groups."""
    gather = reduce = 0.0
    grad_bytes = 4 if work.reduce_fp32 else 2
    if work.shape.experts:
        for params, group, stride in moe.fsdp_groups(work.shape, layout):
            bw = hw.link_gbps(group, stride)
            gather += _ring_seconds(2 * n_blocks * params, group, bw)
            reduce += _ring_seconds(grad_bytes * n_blocks * params, group, bw)
    return gather, reduce


def _fsdp_seconds(work: Workload, layout: Layout, hw: Hardware, stages: RankStages) -> tuple:
    """(total, not overlappable) seconds of FSDP/HSDP/DDP traffic per step (the MoE layers' in
    their own groups, also under TP alone)."""
    moe_sharded = work.shape.experts and moe.token_ranks(layout) > 1
    if not (layout.data_parallel or moe_sharded):
        return 0.0, 0.0
    params = rank_params(work.shape, layout.tp, stages, layout.ep)
    moe_params = stages.n_blocks * moe.gathered_params(work.shape, layout.ep)
    moe_gather, moe_reduce = _moe_fsdp_seconds(work, layout, hw, stages.n_blocks)
    n = layout.fsdp_degree
    shard_bw = hw.link_gbps(n, layout.tp)
    grad_bytes = 4 if work.reduce_fp32 else 2
    gathers = (
        1
        if layout.pp > 1
        else work.accum_steps(layout) * (1 if work.reshard_policy == "never" else 2)
    )
    reduces = 1 if layout.pp > 1 else work.accum_steps(layout)
    counts = param_counts(work.shape, layout.tp, layout.ep)
    lookup = stages.embedding and work.embedding_rows_sharded(layout)
    reduced = params - (counts.embedding if lookup else 0)
    gathered = rank_gather_bytes(work, layout, stages) - 2 * moe_params
    gather = _ring_seconds(gathered, n, shard_bw) + moe_gather
    reduce = _ring_seconds(grad_bytes * (reduced - moe_params), n, shard_bw) + moe_reduce
    total = gathers * gather + reduces * reduce
    r = layout.dp_replicate
    if r > 1:
        rep_bw = hw.link_gbps(r, layout.dp_shard * layout.cp * layout.tp)
        total += 2 * _ring_seconds(grad_bytes * stored_params(work, layout, stages), r, rep_bw)
    # The step's first all-gather and last reduce-scatter have nothing to hide behind.
    largest = max(0 if lookup else counts.embedding, counts.block) / max(reduced, 1)
    edges = largest * (gather + reduce)
    if lookup:  # its output reduce-scatter and gradient all-gather, per microbatch, exposed
        tokens = work.microbatch_tokens(layout)
        lookups = layout.n_microbatches * work.accum_steps(layout)
        edges += 2 * lookups * _ring_seconds(n * tokens * work.shape.dim * 2, n, shard_bw)
    return total, edges


def _tp_cp_pp_seconds(work: Workload, layout: Layout, hw: Hardware, stages: RankStages) -> float:
    """Exposed seconds of TP collectives, CP ring exchange and PP sends per step."""
    model = work.shape
    micro_tokens = work.microbatch_tokens(layout)
    n_micro = layout.n_microbatches * work.accum_steps(layout)
    seconds = 0.0
    if layout.tp > 1:
        per_block = 8 if layout.ac_mode != "full" else 10  # fwd 2 AG + 2 RS, bwd as many
        if model.experts:  # the MoE layer is not tensor-parallel: the attention's only
            per_block //= 2
        size = micro_tokens * model.dim * 2
        count = stages.n_blocks * per_block + 4 * (stages.embedding + stages.head)
        tp_bw = hw.link_gbps(layout.tp, 1)
        seconds += cal.TP_EXPOSED * n_micro * count * _ring_seconds(size, layout.tp, tp_bw)
    if layout.cp > 1:
        kv = 2 * model.kv * 2 * micro_tokens * layout.cp / layout.tp
        cp_bw = hw.link_gbps(layout.cp, layout.tp)
        ring = 3 * _ring_seconds(kv, layout.cp, cp_bw)  # forward gather, backward gather + RS
        seconds += cal.CP_EXPOSED * n_micro * stages.n_blocks * ring
    if layout.pp > 1:
        size = micro_tokens * model.dim * 2 / layout.tp
        stride = layout.dp_replicate * layout.dp_shard * layout.cp * layout.tp
        pp_bw = hw.link_gbps(2, stride) * 1e9 * cal.LINK_EFFICIENCY
        sends = 2 * n_micro * stages.n_stages
        seconds += cal.PP_P2P_EXPOSED * sends * size / pp_bw
    return seconds


def layout_efficiency(layout: Layout) -> float:
    eff = cal.LAYOUT_EFFICIENCY["base"]
    features = {
        "fsdp": layout.data_parallel,
        "tp": layout.tp > 1,
        "pp": layout.pp > 1,
        "cp": layout.cp > 1,
    }
    for name, on in features.items():
        if on:
            eff *= cal.LAYOUT_EFFICIENCY[name]
    return eff


def all_to_all_bytes(work: Workload, layout: Layout, stages: RankStages) -> float:
    """Bytes the expert-parallel token exchange sends from one rank per step (moe.py)."""
    return moe.all_to_all_bytes(work, layout, stages, _recomputed_share(work.shape, layout)[1])


def _rank_parts(work: Workload, layout: Layout, hw: Hardware, stages: RankStages) -> dict:
    compute = _compute_seconds(work, layout, hw, stages)
    fsdp_total, fsdp_edges = _fsdp_seconds(work, layout, hw, stages)
    hbm = hw.card.hbm_gbps * 1e9 * cal.HBM_EFFICIENCY
    optimizer_bytes = cal.OPTIMIZER_TRAFFIC_BYTES_PER_PARAM * stored_params(work, layout, stages)
    parts = {
        "compute": compute,
        "FSDP communication": fsdp_edges + max(0.0, fsdp_total - compute),
        "TP/CP/PP communication": _tp_cp_pp_seconds(work, layout, hw, stages),
        "optimizer": optimizer_bytes / hbm,
        "per-step overhead": cal.STEP_OVERHEAD_SECONDS,
    }
    if work.shape.experts:  # ep ranks are consecutive (the MoE mesh's innermost dimension)
        link = hw.link_gbps(layout.ep, 1) * 1e9 * cal.LINK_EFFICIENCY
        parts["expert all-to-all"] = all_to_all_bytes(work, layout, stages) / link
    return parts


def estimate_time(work: Workload, layout: Layout, hw: Hardware) -> TimeEstimate:
    """Step time on ``hw``; an expert parallel degree the trainer refuses raises ConfigError."""
    moe.check_expert_degree(work.shape, layout)
    ranks = rank_stages(work, layout)
    per_rank = [_rank_parts(work, layout, hw, stages) for stages in ranks]
    parts = max(per_rank, key=lambda p: sum(p.values()))
    bubble = max(bubble_fraction(layout, stages.n_stages) for stages in ranks)
    if bubble:
        parts["pipeline bubble"] = parts["compute"] * bubble / (1 - bubble)
    samples = work.global_samples(layout)
    efficiency = layout_efficiency(layout)
    if work.gathers_on_copy_engines(layout, hw.gpus_per_node):
        efficiency *= cal.COPY_ENGINE_GAIN
    if work.float8 is not None and work.float8.casts_gathers_in_one_kernel(layout.fsdp_degree):
        efficiency *= cal.FLOAT8_ALL_GATHER_CAST_GAIN
    return TimeEstimate(
        parts=parts,
        efficiency=efficiency,
        tokens_per_step=samples * work.seq_len,
        world_size=layout.world_size,
        flops_per_token=work.model.flops_per_token(work.seq_len),
        peak_flops=hw.card.tflops * 1e12,
        all_to_all_bytes=max(all_to_all_bytes(work, layout, stages) for stages in ranks),
    )
