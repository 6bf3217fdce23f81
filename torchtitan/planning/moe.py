"""Mixture-of-Experts layers in the step model: where their weights live, what they keep for
backward, what they compute and what expert parallelism sends.

How the trainer places a MoE layer (torchtitan/parallel/expert_parallel.py and dims.py): the
layer is not tensor-parallel, it runs on each rank's sequence shard, so every rank of
dp_shard x cp x tp holds different tokens for it. Expert parallelism takes ``ep`` of those ranks
(not extra ones): each holds num_experts / ep of every layer's routed experts, and FSDP shards
that slice over the other dp_shard x cp x tp / ep ranks. The router gate and the shared experts
are sharded like a dense block's weights, over dp_shard x cp, and under TP over
dp_shard x cp x tp (their own FSDP group). So a rank stores 1 / (dp_shard x cp x tp) of every
MoE layer, whatever ep, and gathers per layer the router, the shared experts and its ep slice
of the routed experts.

Memory of the weights, gradients and optimizer state counts every expert (total parameters);
compute counts what a token passes through (active parameters: router, shared experts and
top_k routed experts). Grouped GEMMs are assumed to run at the dense matmuls' efficiency (not
calibrated: no MoE step has been measured), and the routing to be balanced (every rank and
expert gets its share of the rows).
"""

from __future__ import annotations

from torchtitan.config import ConfigError
from torchtitan.parallel.expert_parallel import check_expert_parallel
from torchtitan.planning.layout import Layout, Workload
from torchtitan.planning.schedules import RankStages
from torchtitan.planning.shapes import Shapes

# Per routed row (token x chosen expert) without AC: the sort order and the token index
# (int64 each) and the routing weight (bf16) the combine's backward reads.
ROUTING_BYTES_PER_ROW = 8 + 8 + 2


def token_ranks(layout: Layout) -> int:
    """The ranks that hold different tokens in a MoE layer: dp_shard x cp x tp."""
    return layout.dp_shard * layout.cp * layout.tp


def check_expert_degree(shape: Shapes, layout: Layout) -> None:
    """Raise ConfigError (one line) where ``layout.ep`` cannot split this model's experts (the
    trainer's own check) or does not divide the ranks it borrows, dp_shard x cp x tp."""
    reason = check_expert_parallel(shape.experts or None, layout.ep)
    if reason is None and (layout.ep < 1 or token_ranks(layout) % layout.ep):
        reason = (
            f"--parallelism.expert_parallel_degree {layout.ep} must be >= 1 and divide "
            f"dp_shard x cp x tp = {token_ranks(layout)}, the ranks it borrows from"
        )
    if reason:
        raise ConfigError(reason)


def gathered_params(s: Shapes, ep: int) -> float:
    """Weights of one MoE layer that a rank gathers (0 for a dense block): router, shared
    experts and its ep slice of the routed experts."""
    return s.moe_always_params + s.experts * s.expert_params / ep


def stored_params(s: Shapes, layout: Layout) -> float:
    """Weights of one MoE layer that a rank stores: all of them / (dp_shard x cp x tp)."""
    return s.moe_params / token_ranks(layout)


def fsdp_groups(s: Shapes, layout: Layout) -> tuple[tuple[float, int, int], ...]:
    """(weights of one layer gathered, group size, stride in the rank order) of each FSDP group
    holding a MoE layer's weights: one over dp_shard x cp x tp without EP (the block's own
    group without TP: the same ranks); with EP the router and shared experts there and the
    expert slice over the efsdp ranks, ep apart (the MoE mesh is (..., efsdp, ep))."""
    ranks, ep = token_ranks(layout), layout.ep
    if ep == 1:
        return ((float(s.moe_params), ranks, 1),)
    experts = s.experts * s.expert_params / ep
    return ((float(s.moe_always_params), ranks, 1), (experts, ranks // ep, ep))


def saved_bytes_per_token(s: Shapes, kind: str, tp: int, ep: int, act: int) -> float:
    """Bytes one MoE layer keeps for backward per token of the rank's (CP) share of the
    microbatch; the layer runs on the TP sequence shard, hence / tp. k = top_k, D = dim,
    H = an expert's hidden size, S = the shared experts', E = experts; ``act`` bytes each.

    none: fp32 router scores (E), the routed rows' indices and weights, the rows gathered for
    the experts (kD), the w1 and w3 outputs (2kH), their SiLU product w2 reads (kH), the down
    output the routing weights scale (kD), and the shared experts as a dense SwiGLU (3S).
    Selective op keeps the matmul outputs (the grouped GEMMs are matmuls): the router's logits
    (E), w1, w3 (2kH) and w2 (kD) outputs, and the shared w1, w3 (2S; w2's output, which no
    backward reads, is dropped by the compiler as in a dense block). With save_matmuls
    alternate, counting the block's matmuls from wq, it keeps the router's, w3's (kH) and the
    shared w1's (S) outputs. Under EP the token exchanges' outputs are kept too (the policy
    saves all-to-alls): the dispatched rows (kD) and, under alternate, the combined rows (kD),
    which stand in for w2's output otherwise. Full AC: only the block input (counted with
    the block). These are assumptions from the ops (no MoE layer has been measured)."""
    if not s.experts or kind == "full":
        return 0.0
    k, d, h, e = s.top_k, s.dim, s.expert_ffn, s.experts
    exchanged = act * k * d if ep > 1 else 0.0
    if kind == "none":
        routed = k * ROUTING_BYTES_PER_ROW + act * k * (2 * d + 3 * h)
        total = 4 * e + routed + act * 3 * s.shared_ffn
    elif kind == "all":
        total = act * (e + k * (2 * h + d) + 2 * s.shared_ffn) + exchanged
    else:  # alternate
        total = act * (e + k * h + s.shared_ffn) + 2 * exchanged
    return total / tp


def combine_bytes_per_token(s: Shapes, tp: int) -> float:
    """The transient fp32 (tokens x top_k, dim) rows the combine sums in (forward) and its
    backward gathers the gradient into: on top of the held activations at the peak."""
    return 4 * s.top_k * s.dim / tp


def matmul_flops_per_token(s: Shapes, kind: str, whole_share: float) -> float:
    """Training FLOPs of one MoE layer's matmuls per token it processes: 6 x the active weights,
    + the forward that AC recomputes: ``whole_share`` of the blocks recomputed whole (full,
    every N-th), or under alternate every other matmul (the experts' w1 and w2, the shared
    w3); the router's logits and the rest are kept."""
    router, shared = s.dim * s.experts, 3 * s.dim * s.shared_ffn
    routed = s.top_k * s.expert_params
    forward = 2 * (router + shared + routed)
    if whole_share:
        recomputed = whole_share * forward
    elif kind == "alternate":
        recomputed = 2 * (routed * 2 / 3 + shared / 3)
    else:
        recomputed = 0.0
    return 3 * forward + recomputed


def all_to_all_bytes(
    work: Workload, layout: Layout, stages: RankStages, whole_share: float = 0.0
) -> float:
    """Bytes one rank sends per optimizer step through the expert-parallel token exchange:
    per MoE layer and microbatch two all-to-alls forward (dispatch, combine) and two backward,
    each of tokens x top_k rows of dim (the rank's sequence shard), of which (ep - 1) / ep
    leave the rank; blocks recomputed whole (``whole_share``) exchange their forward again.
    0 without expert parallelism."""
    s = work.shape
    if not s.experts or layout.ep == 1:
        return 0.0
    tokens = work.microbatch_tokens(layout) / layout.tp
    act = 2 if work.bf16 else 4
    one = tokens * s.top_k * s.dim * act * (layout.ep - 1) / layout.ep
    micro = layout.n_microbatches * work.accum_steps(layout)
    return micro * stages.n_blocks * (4 + 2 * whole_share) * one


def describe_params(model) -> str:
    """ "30.5B total, 3.3B active per token" for a model whose args count both (MoE; the
    embedding table counted in both, as published counts do)."""
    total, active = model.num_params(), model.active_params(include_embedding=True)
    return f"{_count(total)} total, {_count(active)} active per token"


def _count(n: float) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
