"""Per-GPU peak memory of a training step: what each part holds at the step's peak.

The peak comes at the start of backward: the weights, optimizer state and every activation of
the in-flight microbatches are alive, and the last stage runs the loss backward (or, on other
pipeline ranks, the first block recomputes). Gradients are not alive yet (the trainer sets them
to None after each step), except those that pipeline parallelism or gradient accumulation carry
across microbatches. The sum is scaled by the calibrated allocator overhead (calibration.py),
since the measured figure is ``torch.cuda.max_memory_reserved``.

MoE blocks (moe.py): a rank gathers the router, the shared experts and its ep slice of the
routed experts, and stores 1 / (dp_shard x cp x tp) of every MoE layer's weights (all experts).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from torchtitan.models.llama3 import ModelArgs
from torchtitan.planning import calibration as cal
from torchtitan.planning import moe
from torchtitan.planning.activations import (
    ac_kind,
    block_bytes_per_token,
    block_fixed_bytes,
    loss_peak_bytes_per_token,
    recompute_bytes_per_token,
)
from torchtitan.planning.float8 import HEAD
from torchtitan.planning.hardware import GIB
from torchtitan.planning.layout import Layout, Workload
from torchtitan.planning.schedules import RankStages, inflight_chunks, rank_stages
from torchtitan.planning.shapes import Shapes, shapes


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of one rank's units after tensor (and expert) parallelism, before FSDP
    sharding: what FSDP gathers."""

    block: float
    embedding: float
    head: float  # final norm + output projection


def param_counts(model: ModelArgs | Shapes, tp: int, ep: int = 1) -> ParamCounts:
    """TP shards every projection and the embedding; the RMSNorm weights are replicated. A MoE
    layer is not split by TP; EP splits its routed experts (moe.gathered_params)."""
    return _param_counts(shapes(model), tp, ep)


@functools.lru_cache(maxsize=256)
def _param_counts(s: Shapes, tp: int, ep: int) -> ParamCounts:
    return ParamCounts(
        block=(s.block_params - 2 * s.dim) / tp + 2 * s.dim + moe.gathered_params(s, ep),
        embedding=s.vocab * s.dim / tp,
        head=s.vocab * s.dim / tp + s.dim,
    )


def rank_params(model: ModelArgs | Shapes, tp: int, stages: RankStages, ep: int = 1) -> float:
    counts = param_counts(model, tp, ep)
    total = stages.n_blocks * counts.block
    total += counts.embedding if stages.embedding else 0
    total += counts.head if stages.head else 0
    return total


def stored_params(work: Workload, layout: Layout, stages: RankStages) -> float:
    """Parameters one rank stores (fp32 weights, optimizer state, sharded gradients): its units
    after TP / the FSDP degree, but every MoE layer / (dp_shard x cp x tp) (moe.py)."""
    params = rank_params(work.shape, layout.tp, stages, layout.ep)
    shard = layout.fsdp_degree if layout.data_parallel else 1
    if not work.shape.experts:
        return params / shard
    gathered = stages.n_blocks * moe.gathered_params(work.shape, layout.ep)
    return (params - gathered) / shard + stages.n_blocks * moe.stored_params(work.shape, layout)


@dataclass
class MemoryEstimate:
    """Bytes by part at the peak of the worst pipeline rank (the only rank without PP)."""

    parts: dict[str, float] = field(default_factory=dict)
    pp_rank: int = 0

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    def largest(self, n: int = 3) -> list[tuple[str, float]]:
        return sorted(self.parts.items(), key=lambda kv: -kv[1])[:n]

    def describe(self, n: int = 3) -> str:
        top = ", ".join(f"{name} {b / GIB:.1f}" for name, b in self.largest(n))
        return f"{self.total_gib:.1f} GiB ({top})"


def estimate_memory(work: Workload, layout: Layout) -> MemoryEstimate:
    """The peak over pipeline ranks (ranks differ in stages, in-flight microbatches and loss).
    An expert parallel degree the trainer refuses raises ConfigError."""
    moe.check_expert_degree(work.shape, layout)
    estimates = [_rank_memory(work, layout, stages) for stages in rank_stages(work, layout)]
    return max(estimates, key=lambda e: e.total)


def _rank_memory(work: Workload, layout: Layout, stages: RankStages) -> MemoryEstimate:
    parts: dict[str, float] = {}
    stored = stored_params(work, layout, stages)
    parts["weights (fp32)"] = 4 * stored
    parts["optimizer state"] = cal.OPTIMIZER_BYTES_PER_PARAM * stored
    parts["gradients"] = _carried_gradients(work, layout, stages)
    parts["bf16 weight copies"] = _working_weights(work, layout, stages)
    parts["communication buffers"] = _comm_buffers(work, layout, stages)
    parts["activations"] = _activations(work, layout, stages)
    name, transient = _loss_or_recompute(work, layout, stages)
    parts[name] = transient
    overhead = cal.ALLOCATOR_FRAGMENTATION * sum(parts.values()) + cal.ALLOCATOR_CONSTANT_BYTES
    parts["allocator overhead"] = overhead
    return MemoryEstimate(parts, stages.pp_rank)


def _carried_gradients(work: Workload, layout: Layout, stages: RankStages) -> float:
    """Gradients alive at the peak: PP accumulates unsharded gradients (in the reduce dtype)
    over its microbatches, except the row-sharded embedding's, which stay sharded in fp32;
    gradient accumulation keeps the sharded ones of earlier micro-steps."""
    params = rank_params(work.shape, layout.tp, stages, layout.ep)
    shard = layout.fsdp_degree if layout.data_parallel else 1
    grad_bytes = 4 if work.reduce_fp32 or not layout.data_parallel else 2
    if layout.pp > 1 and layout.data_parallel:
        carried = grad_bytes * params
        if stages.embedding and work.embedding_rows_sharded(layout):
            embedding = param_counts(work.shape, layout.tp).embedding
            carried -= grad_bytes * embedding - 4 * embedding / shard
        return carried
    if work.accum_steps(layout) > 1 or layout.pp > 1:
        return 4 * stored_params(work, layout, stages)
    return 0.0


def unit_gather_bytes(work: Workload, layout: Layout) -> tuple[float, float, float]:
    """Bytes FSDP all-gathers for one block, the embedding and the head group: bf16 weights,
    but 1 byte for the float8 linears' weights under fsdp_float8_all_gather, and nothing for
    an embedding looked up where its rows live."""
    counts = param_counts(work.shape, layout.tp, layout.ep)
    in_float8 = work.float8_gathered(layout)
    block_float8 = sum(n for name, n in work.shape.linears.items() if name in in_float8)
    head_float8 = work.shape.vocab * work.shape.dim if HEAD in in_float8 else 0
    return (
        2 * counts.block - block_float8 / layout.tp,
        0.0 if work.embedding_rows_sharded(layout) else 2 * counts.embedding,
        2 * counts.head - head_float8 / layout.tp,
    )


def rank_gather_bytes(work: Workload, layout: Layout, stages: RankStages) -> float:
    """Bytes FSDP all-gathers for every group a rank holds (its blocks, embedding, head)."""
    block, embedding, head = unit_gather_bytes(work, layout)
    total = stages.n_blocks * block
    return total + (embedding if stages.embedding else 0) + (head if stages.head else 0)


def _working_weights(work: Workload, layout: Layout, stages: RankStages) -> float:
    """bf16 copies of the weights alive at the peak.

    FSDP gathers bf16 weights per group: the head group stays gathered from its forward to its
    backward, and the last block is gathered again (prefetched) for its backward; every block,
    the last one too, reshards after its forward. Under PP (or with fsdp_reshard_after_forward
    never) every gathered group stays until backward. On one GPU autocast keeps a bf16 copy of
    the head (the blocks' copies are in block_fixed_bytes).
    """
    if not work.bf16:
        return 0.0
    block, _, head = unit_gather_bytes(work, layout)
    head = head if stages.head else 0.0
    if not layout.data_parallel:
        return 0.0 if HEAD in work.float8_linears else head
    keep_all = layout.pp > 1 and work.reshard_policy != "always"
    if keep_all or work.reshard_policy == "never":
        return rank_gather_bytes(work, layout, stages)
    return head + block


def _comm_buffers(work: Workload, layout: Layout, stages: RankStages) -> float:
    """FSDP's all-gather and reduce-scatter run on their own CUDA streams; the caching allocator
    keeps what they free for those streams, about two of the largest groups each (gathered
    weights, gradients in the reduce dtype); a row-sharded embedding is not one of them. PP adds
    its send/receive buffers per in-flight chunk."""
    total = 0.0
    if layout.data_parallel and work.bf16:
        counts = param_counts(work.shape, layout.tp, layout.ep)
        gathered = unit_gather_bytes(work, layout)
        grad_bytes = 4 if work.reduce_fp32 else 2
        units = zip(gathered, (counts.block, counts.embedding, counts.head))
        gathered_embedding = stages.embedding and not work.embedding_rows_sharded(layout)
        held = (True, gathered_embedding, stages.head)
        largest = max(g + grad_bytes * n for (g, n), on in zip(units, held) if on)
        total += cal.FSDP_STREAM_GROUPS * largest
    if layout.pp > 1:
        tokens = work.microbatch_tokens(layout)
        total += 2 * 2 * tokens * work.shape.dim / layout.tp * stages.n_stages
    return total


def _block_kwargs(work: Workload, layout: Layout) -> dict:
    return dict(
        tp=layout.tp,
        cp=layout.cp,
        bf16=work.bf16,
        autocast=work.bf16 and not layout.data_parallel,
        compiled=work.compile,
        float8=work.float8_linears,
        ep=layout.ep,
    )


def _checkpointed_blocks(layout: Layout, n_blocks: int) -> tuple[str, int]:
    """(kind of the checkpointed blocks, how many of n_blocks are checkpointed that way)."""
    if layout.ac_mode == "selective" and layout.ac_option != "op":
        every = int(layout.ac_option)
        return "full", math.ceil(n_blocks / every)
    return ac_kind(layout.ac_mode, layout.save_matmuls), n_blocks


def _stage_bytes(work: Workload, layout: Layout, n_blocks: int, tokens: float) -> float:
    kind, n_kind = _checkpointed_blocks(layout, n_blocks)
    kwargs = _block_kwargs(work, layout)
    model = work.shape
    fixed = dict(autocast=kwargs["autocast"], tp=layout.tp, float8=kwargs["float8"], ep=layout.ep)
    total = n_kind * (
        block_bytes_per_token(model, kind, **kwargs) * tokens
        + block_fixed_bytes(model, kind, **fixed)
    )
    rest = n_blocks - n_kind
    total += rest * (
        block_bytes_per_token(model, "none", **kwargs) * tokens
        + block_fixed_bytes(model, "none", **fixed)
    )
    return total


def _activations(work: Workload, layout: Layout, stages: RankStages) -> float:
    tokens = work.microbatch_tokens(layout)
    chunks = inflight_chunks(layout, stages.pp_rank, stages.n_stages)
    per_stage = [_stage_bytes(work, layout, n, tokens) for n in stages.layers]
    # Held chunks spread over the rank's stages; weight them by the stages' mean.
    return chunks * sum(per_stage) / len(per_stage)


def _loss_or_recompute(work: Workload, layout: Layout, stages: RankStages) -> tuple[str, float]:
    """The larger transient on top of the held activations: the loss (last stage) or one
    checkpointed block's recompute (with a MoE layer's fp32 combine rows in its backward)."""
    tokens = work.microbatch_tokens(layout)
    kind, _ = _checkpointed_blocks(layout, max(stages.layers))
    recompute = recompute_bytes_per_token(work.shape, kind, **_block_kwargs(work, layout)) * tokens
    recompute += moe.combine_bytes_per_token(work.shape, layout.tp) * tokens
    if not stages.head:
        return "block recompute", recompute
    shards = layout.tp if work.loss_parallel else 1
    kind = work.loss_kind(layout)
    loss = loss_peak_bytes_per_token(work.shape, kind, shards, work.bf16) * tokens
    return ("logits + loss", loss) if loss >= recompute else ("block recompute", recompute)
