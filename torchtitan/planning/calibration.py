"""Every constant of the step model that was fitted to measurements rather than derived, in one
place. docs/planning.md says where each comes from; tests/unit/test_planning.py checks the
model against the measured points of tests/unit/data/planning_measured.toml."""

from __future__ import annotations

# ------------------------------------------------------------------------------------ memory

OPTIMIZER_BYTES_PER_PARAM = 8  # AdamW / Adam: exp_avg + exp_avg_sq in fp32
# torch.cuda.max_memory_reserved over the allocated peak: rounding, blocks cached for reuse.
ALLOCATOR_FRAGMENTATION = 0.035
ALLOCATOR_CONSTANT_BYTES = 0.25 * 2**30  # cuBLAS/cuDNN workspaces, small tensors, RoPE cache
# FSDP's all-gather / reduce-scatter streams keep about this many of the largest groups cached.
FSDP_STREAM_GROUPS = 3.3

# Context parallelism under selective AC (or none) keeps this many times the other CP ranks'
# K/V per token per block: set to 1, not fitted, and checked against the one CP point measured
# with native GQA (-3.1%). torch's ring attention saves only the local q, k, v, output for its
# backward; where the extra memory goes is open.
CP_SAVED_KV = 1.0

# Memory the card has but the caching allocator cannot use (CUDA context, NCCL buffers).
NON_ALLOCATOR_BYTES = 2.5 * 2**30

# -------------------------------------------------------------------------------------- time

# Share of the card's dense bf16 peak reached by the compiled blocks' matmuls and by SDPA flash
# attention (causal FLOPs, i.e. half the square), from per-block timings on an H100.
MATMUL_EFFICIENCY = 0.70
ATTENTION_EFFICIENCY = {64: 0.32, 128: 0.40}  # by head_dim, long sequences
ATTENTION_HALF_SEQ = 1950  # sequence length (per CP rank) at which half of that is reached
# Float8 linears' GEMMs (tensorwise, our backward: --float8.own_backward, the default since call
# 69) over bf16, net of their casts and amax reductions. Fitted with LAYOUT_EFFICIENCY (below) on
# a 0.01 grid, least squares on the log tokens/s errors of all points. (In call 98, with the
# layout factors then, 1.55 fitted the 23 tensorwise points without TP.) One compiled 8B block
# (bf16 parameters, one H200, call 98) puts the linears' float8 time at 1/1.59 of bf16's without
# AC and 1/1.66 under selective AC (the block less its bf16 non-matmul time).
FLOAT8_MATMUL_SPEEDUP = 1.49
# Rowwise (per-row scales, and rowwise_with_gw_hp's float8 GEMMs): fitted to 8B FSDP4 rowwise
# with selective AC, 9,772 tokens/s/GPU on 4x H200 (call 24), against 9,012 in bf16 (call 16).
# That run rounds like eager (float8.py), which costs some speed; applied to every rowwise layout.
FLOAT8_ROWWISE_MATMUL_SPEEDUP = 1.12
# torchao's tensorwise backward (--float8.own_backward false, every float8 point before call 69)
# over ours, on the float8 linears' time, from the same 8B block (call 98): 10.37 against 8.70
# ms without AC, where its backward's inductor reductions took 3.14 against 1.17 ms, and 9.71
# against 9.42 ms under selective AC (measured there; applied to every checkpointed mode). At
# 1B's shapes it costs less: 0.7 % of the trainer's step without AC (call 69), so the 1B points
# of torchao's backward run 2-6 % faster than estimated.
FLOAT8_TORCHAO_TENSORWISE_BACKWARD_SPEED = {"none": 0.839, "checkpointed": 0.970}
# Our rowwise backward (--float8.own_backward, the default; docs/performance.md finding 28) over
# torchao's, on the rowwise linears' time: the 8B block under selective AC 21.12 -> 18.88 ms
# (-10.6 %, one H200, calls 79-81). Fitted to the two 8B FSDP2 points of call 81 (2x H200),
# -10.1 and -10.0 % without it, -0.1 and +0.0 % with it.
FLOAT8_ROWWISE_OWN_BACKWARD_GAIN = 1.18
# Under TP the float8 linears ran *slower* than bf16, in both frameworks and with either TP
# style: 8B FSDP2xTP2 on 4x H100 (call 18, one call) Float8 6,040 tokens/s/GPU against bf16
# 7,653 (0.79x of the step); on 4x H200 Float8 6,559-7,332 (float8 styles) and 7,288 (plain)
# against bf16 ~7,788 (another call); the reference 6,179-7,520 against 7,921. Fitted as the
# float8 linears' GEMM time over bf16's under TP (0.78 gave 0.85x of the whole step). The cause:
# an amax all-reduce per cast of a TP-sharded tensor (docs/performance.md, finding 14); what is
# left with --float8.tp_shard_scales false. Rebalanced with LAYOUT_EFFICIENCY after call 100 (its
# four points' mean log error zero): 0.81.
FLOAT8_SPEED_UNDER_TP = 0.81
# With --float8.tp_shard_scales (the default since 2026-11-27) no amax is all-reduced: 8B
# FSDP2xTP2 Float8 7,730, 7,996 and 9,536 tokens/s/GPU (calls 21, 27, 32, 4x H200) against bf16
# 7,858-8,035 (calls 20, 26, 29). The calls spread by ~20%, and the reference's Float8 row moved
# with them (6,449 in call 27, 7,634 in call 32). Fitted to balance the three (+9%, +6%, -11%):
# 1.2; rebalanced with LAYOUT_EFFICIENCY after call 100: 1.12.
FLOAT8_SPEED_UNDER_TP_SHARD_SCALES = 1.12
EAGER_SLOWDOWN = 0.76  # tokens/s of eager blocks relative to compiled (1B, 1x H200)
# Bytes moved per token per vocabulary entry by the loss's forward + backward, at HBM_EFFICIENCY.
# In place: read, then read and write the bf16 logits. Compiled: its kernels took 10.33 ms where
# the in-place ones took 6.42 (32,768 x 128,256 bf16 logits, H200, call 51,
# scripts/bench/cross_entropy.py), so 6 x 10.33 / 6.42.
# Compiled under loss parallel: the in-place loss's 6 plus the 4.1 ms per step the standard loss
# took over it (1B TP2, 2x H200, call 54).
LOSS_TRAFFIC_BYTES_PER_VOCAB = {
    "eager": 32.0,
    "compiled": 9.7,
    "in_place": 6.0,
    "compiled_loss_parallel": 20.0,
}
HBM_EFFICIENCY = 0.75  # achieved share of memory bandwidth in memory-bound kernels
OPTIMIZER_TRAFFIC_BYTES_PER_PARAM = 32  # fused AdamW reads p, g, m, v, writes p, m, v; + norm
LINK_EFFICIENCY = 0.8  # NCCL bus bandwidth over the link's datasheet bandwidth
TP_EXPOSED = 1.0  # share of TP collectives not hidden behind compute (no async TP)
CP_EXPOSED = 0.05  # share of ring-attention K/V exchange not hidden behind attention
PP_P2P_EXPOSED = 0.2
# Per optimizer step: grad-norm clipping, zeroing, the loss/norm host syncs, Python, data.
STEP_OVERHEAD_SECONDS = 0.015

# The blocks' all-gathers on the copy engines (docs/performance.md, findings 21 and 29): the
# matmuls they overlap keep their SMs. Same-call pairs against NCCL's all-gather: 8B FSDP4 bf16
# +1.2 % (call 49, 4x H200); 8B FSDP2 on 2x H200 bf16 +1.4 %, Float8 tensorwise +0.6 % (call 82),
# rowwise +1.0 % (call 81). Their mean, on the whole step.
COPY_ENGINE_GAIN = 1.0105
# FSDP's float8 all-gather casting each weight shard in one kernel of ours instead of torchao's
# three eager kernels (--float8.fused_all_gather_cast, docs/performance.md finding 26): 8B FSDP4
# Float8 under selective AC, 11,734 -> 12,102 tokens/s/GPU in one call (call 72, 4x H200). The
# one same-call pair, on the whole step.
FLOAT8_ALL_GATHER_CAST_GAIN = 1.031

# End-to-end factor of each parallelism (a layout's factor is the product of its parts'): what
# the terms above miss, such as launch gaps, Python overhead and imperfect overlap (above 1: what
# they overcount). base, fsdp and tp refitted after call 100 (before: 0.98, 0.90, 0.92) by least
# squares on the log tokens/s errors of the 111 points, alternating with FLOAT8_MATMUL_SPEEDUP
# and the two float8-under-TP constants until none moved. The root mean square error went from
# 4.9 to 3.7 %: the one-GPU points had run 3.6 % faster than estimated on average, the FSDP
# ones 1.2 % slower. pp and cp stay 1.0: fitted too (1.04 and 1.07), they made FSDP2xCP2 the
# planner's pick for 8B at seq 8192 on 4x H200, a layout never measured, from CP points measured
# only at seq 32768.
LAYOUT_EFFICIENCY = {"base": 1.02, "fsdp": 0.874, "tp": 0.945, "pp": 1.0, "cp": 1.0}


def attention_efficiency(head_dim: int, seq_len: float) -> float:
    """Flash attention's share of peak grows with the sequence (fewer partial and masked tiles):
    ATTENTION_EFFICIENCY x seq / (seq + ATTENTION_HALF_SEQ), by head_dim (interpolated)."""
    points = sorted(ATTENTION_EFFICIENCY.items())
    (x0, y0), (x1, y1) = points[0], points[-1]
    share = min(max((head_dim - x0) / (x1 - x0), 0.0), 1.0)
    return (y0 + (y1 - y0) * share) * seq_len / (seq_len + ATTENTION_HALF_SEQ)
