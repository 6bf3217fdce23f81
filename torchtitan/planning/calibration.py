"""Every constant of the step model that was fitted to measurements rather than derived, in one
place. docs/planning.md says where each comes from; tests/unit/test_planning.py checks the
model against the measured points of tests/unit/data/planning_measured.toml."""

from __future__ import annotations

# ------------------------------------------------------------------------------------ memory

OPTIMIZER_BYTES_PER_PARAM = 8  # AdamW / Adam: exp_avg + exp_avg_sq in fp32
# Memory constants: fitted to the measured points (H100 and H200, 2026-11-26 to 2026-11-29).
# torch.cuda.max_memory_reserved over the allocated peak: rounding, blocks cached for reuse.
ALLOCATOR_FRAGMENTATION = 0.035
ALLOCATOR_CONSTANT_BYTES = 0.25 * 2**30  # cuBLAS/cuDNN workspaces, small tensors, RoPE cache
# FSDP's all-gather / reduce-scatter streams keep about this many of the largest groups cached.
FSDP_STREAM_GROUPS = 3.3

# Context parallelism under selective AC (or none) keeps this many times the other CP ranks'
# K/V per token per block: set to 1, not fitted, and checked against the CP points measured with
# native GQA (8B CP4 seq 32768: -3.1 % on 4x H100, 2026-11-26; +1.8 to +2.5 % on 4x H200,
# 2026-11-27/28). torch's ring attention saves only the local q, k, v, output for its
# backward; where the extra memory goes is open.
CP_SAVED_KV = 1.0

# Memory the card has but the caching allocator cannot use (CUDA context, NCCL buffers).
NON_ALLOCATOR_BYTES = 2.5 * 2**30

# -------------------------------------------------------------------------------------- time

# Share of the card's dense bf16 peak reached by the compiled blocks' matmuls and by SDPA flash
# attention (causal FLOPs, i.e. half the square), from per-block timings (H100, torch 2.11,
# 2026-11-26).
MATMUL_EFFICIENCY = 0.70
ATTENTION_EFFICIENCY = {64: 0.32, 128: 0.40}  # by head_dim, long sequences
ATTENTION_HALF_SEQ = 1950  # sequence length (per CP rank) at which half of that is reached
# Float8 tensorwise linears' GEMMs (our backward) over bf16, net of their casts and amax
# reductions. Fitted together with LAYOUT_EFFICIENCY by least squares on the log tokens/s errors
# of all measured points (0.01 grid). For comparison, one compiled 8B block (bf16 parameters,
# one H200, 2026-11-29) runs its linears in float8 in 1/1.59 of their bf16 time without AC and
# 1/1.66 under selective AC (the block less its bf16 non-matmul time).
FLOAT8_MATMUL_SPEEDUP = 1.49
# Rowwise (per-row scales; also rowwise_with_gw_hp's float8 GEMMs) with torchao's backward, over
# bf16: fitted to 8B FSDP4 rowwise under selective AC, 9,772 tokens/s/GPU against 9,012 in bf16
# (4x H200, 2026-11-27). That run rounds like eager (float8.py), which costs some speed; applied
# to every rowwise layout.
FLOAT8_ROWWISE_MATMUL_SPEEDUP = 1.12
# torchao's tensorwise backward over ours, on the float8 linears' time: one compiled 8B block
# (one H200, 2026-11-29) took 10.37 against 8.70 ms without AC (its backward's inductor
# reductions 3.14 against 1.17 ms) and 9.71 against 9.42 ms under selective AC (applied to every
# checkpointed mode). The trainer always runs ours; this translates the measured points of older
# code that ran torchao's (compare.py). At 1B's shapes torchao's costs less (0.7 % of the step
# without AC), so those 1B points run 2-6 % faster than estimated.
FLOAT8_TORCHAO_TENSORWISE_BACKWARD_SPEED = {"none": 0.839, "checkpointed": 0.970}
# Our rowwise backward over torchao's, on the rowwise linears' time. One 8B block under selective
# AC: 21.12 -> 18.88 ms (-10.6 %, one H200, 2026-11-28). Fitted to two 8B FSDP2 points (2x H200,
# 2026-11-28): -10.1 and -10.0 % estimated with torchao's backward, -0.1 and +0.0 % with ours.
FLOAT8_ROWWISE_OWN_BACKWARD_GAIN = 1.18
# Float8 linears' GEMM time over bf16's under TP where each cast all-reduces the amax of a
# TP-sharded tensor: rowwise, and the measured tensorwise points of older code that did so
# (docs/performance.md). 8B FSDP2xTP2 under selective AC ran *slower* in float8 than in bf16 in
# both frameworks: 6,040 against 7,653 tokens/s/GPU (4x H100, 2026-11-27); 6,559-7,332 against
# ~7,788 (4x H200, 2026-11-26/27), the reference 6,179-7,520 against 7,921. Fitted with
# LAYOUT_EFFICIENCY to a mean log error of zero over those four points.
FLOAT8_SPEED_UNDER_TP = 0.81
# The same where each TP shard of a tensorwise linear is scaled on its own (no amax all-reduce;
# the trainer's tensorwise float8 under TP): 8B FSDP2xTP2 Float8 7,730, 7,996 and 9,536
# tokens/s/GPU against bf16 7,858-8,035 (4x H200, 2026-11-27; the runs spread by ~20 %, and the
# reference's Float8 row moved with them). Fitted with LAYOUT_EFFICIENCY to balance the three.
FLOAT8_SPEED_UNDER_TP_SHARD_SCALES = 1.12
EAGER_SLOWDOWN = 0.76  # tokens/s of eager blocks relative to compiled (1B, H200, 2026-11-26)
# Bytes moved per token per vocabulary entry by the loss's forward + backward, at HBM_EFFICIENCY.
# In place: read, then read and write the bf16 logits. Compiled: its kernels took 10.33 ms where
# the in-place ones took 6.42 (32,768 x 128,256 bf16 logits, one H200, 2026-11-28), so
# 6 x 10.33 / 6.42. Compiled under loss parallel: the in-place loss's 6 plus the 4.1 ms per step
# the standard loss took over it (1B TP2, 2x H200, 2026-11-28).
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

# --experimental.fsdp_copy_engine_all_gather: the blocks' all-gathers on the copy engines leave
# the SMs to the matmuls they overlap (docs/performance.md). Pairs against NCCL's all-gather, run
# one after the other on one machine: 8B FSDP4 bf16 +1.2 % (4x H200); 8B FSDP2 bf16 +1.4 %,
# Float8 tensorwise +0.6 %, rowwise +1.0 % (2x H200); all 2026-11-28. Their mean, on the whole
# step.
COPY_ENGINE_GAIN = 1.0105
# FSDP's float8 all-gather casting each weight shard in one kernel of ours instead of torchao's
# three eager kernels (the trainer's, wherever the scales are precomputed): 8B FSDP4 Float8
# under selective AC, 11,734 -> 12,102 tokens/s/GPU, run one after the other (4x H200,
# 2026-11-28), on the whole step.
FLOAT8_ALL_GATHER_CAST_GAIN = 1.031

# End-to-end factor of each parallelism (a layout's factor is the product of its parts'): what
# the terms above miss, such as launch gaps, Python overhead and imperfect overlap (above 1: what
# they overcount). base, fsdp and tp: least squares on the log tokens/s errors of the measured
# points (H100 and H200, 2026-11-26 to 2026-11-29), alternating with FLOAT8_MATMUL_SPEEDUP and
# the two float8-under-TP constants until none moved; the root mean square error is 3.7 %. pp and
# cp stay 1.0: fitted (1.04 and 1.07), they made FSDP2xCP2 the planner's pick for 8B at seq 8192
# on 4x H200, a layout never measured, from CP points measured only at seq 32768.
LAYOUT_EFFICIENCY = {"base": 1.02, "fsdp": 0.874, "tp": 0.945, "pp": 1.0, "cp": 1.0}


def attention_efficiency(head_dim: int, seq_len: float) -> float:
    """Flash attention's share of peak grows with the sequence (fewer partial and masked tiles):
    ATTENTION_EFFICIENCY x seq / (seq + ATTENTION_HALF_SEQ), by head_dim (interpolated)."""
    points = sorted(ATTENTION_EFFICIENCY.items())
    (x0, y0), (x1, y1) = points[0], points[-1]
    share = min(max((head_dim - x0) / (x1 - x0), 0.0), 1.0)
    return (y0 + (y1 - y0) * share) * seq_len / (seq_len + ATTENTION_HALF_SEQ)
