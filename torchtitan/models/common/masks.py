"""Attention masks: which earlier tokens each token may attend to, built once per forward.

``mask = "causal"``: every token attends to every earlier token of its sequence. ``"document"``:
only to earlier tokens of its own document (packed sequences hold several). Documents are given
by ``positions`` (batch, seq): each token's position inside its document, 0 where a document
starts (the data loader emits them; a sequence's first token is always a start).

One mask per attention kernel, all meaning the same thing:

* ``None``: causal SDPA (``is_causal=True``), the plain default;
* ``DenseMask``: a boolean (batch, 1, q, kv) matrix for SDPA: document masking on CPU, where
  FlexAttention has no backward and varlen no kernel; it costs q x kv bytes per sequence;
* ``FlexMask``: a FlexAttention ``BlockMask`` whose fully masked 128 x 128 blocks are skipped;
* ``VarlenMask``: the documents' cumulative lengths over the flattened batch, for varlen attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from torchtitan.config import AttentionKernel, AttentionMaskKind, choices

ATTENTION_KINDS = choices(AttentionKernel)
MASK_KINDS = choices(AttentionMaskKind)
FLEX_BLOCK = 128  # FlexAttention's default block size; seq_len must be a multiple of it


@dataclass(frozen=True)
class AttentionOptions:
    """How a model attends: the kernel, the mask and whether RoPE restarts at each document."""

    kernel: str = "sdpa"
    mask: str = "causal"
    reset_positions: bool = False

    @property
    def needs_positions(self) -> bool:
        """Whether forward needs the tokens' document positions (any mask but SDPA's causal
        one is built from them: under sequence parallelism they give the full length)."""
        return self.mask == "document" or self.reset_positions or self.kernel != "sdpa"

    def validate(self) -> None:
        if self.kernel not in ATTENTION_KINDS:
            raise ValueError(f"model.attention must be one of {ATTENTION_KINDS}; got {self.kernel}")
        if self.mask not in MASK_KINDS:
            raise ValueError(f"model.mask must be one of {MASK_KINDS}; got {self.mask}")


def attention_options(model) -> AttentionOptions:
    """The ``[model]`` section's attention options."""
    return AttentionOptions(model.attention, model.mask, model.reset_positions)


@dataclass(frozen=True)
class DenseMask:
    allowed: torch.Tensor  # bool (batch or 1, 1, q, kv): True where q may attend to kv
    # Under context parallelism: gathers the keys/values of every rank (the queries are local).
    gather_kv: Callable[[torch.Tensor], torch.Tensor] | None = None


@dataclass(frozen=True)
class FlexMask:
    block_mask: object  # torch.nn.attention.flex_attention.BlockMask
    gather_kv: Callable[[torch.Tensor], torch.Tensor] | None = None


class SequenceShardLike(Protocol):
    """A context-parallel rank's share of the sequence (torchtitan.parallel's SequenceShard)."""

    index: torch.Tensor  # (local seq,) full-sequence position of each local token
    gather: Callable[[torch.Tensor], torch.Tensor]  # (batch, local seq, ...) -> full sequence


@dataclass(frozen=True)
class VarlenMask:
    cu_seqlens: torch.Tensor  # int32 (documents + 1,): starts of documents in the flat batch
    max_len: int


AttentionMask = DenseMask | FlexMask | VarlenMask | None


def document_ids(positions: torch.Tensor) -> torch.Tensor:
    """(batch, seq) document index of each token, counted from 0 in each sequence."""
    return torch.cumsum(positions == 0, dim=1, dtype=torch.int32) - 1


def build_mask(
    options: AttentionOptions,
    positions: torch.Tensor | None,
    shard: SequenceShardLike | None = None,
) -> AttentionMask:
    """The mask of ``options`` for a batch whose tokens have ``positions`` (None is enough for
    SDPA's causal mask, which needs nothing built). Under context parallelism ``positions``
    covers the whole sequence and the mask the rows of this rank's queries (``shard``)."""
    if positions is None:
        if options.needs_positions:
            raise ValueError(
                f"model.attention={options.kernel}, mask={options.mask}, reset_positions="
                f"{options.reset_positions}: forward needs the tokens' positions (positions=...)"
            )
        return None
    if shard is not None:
        return _sharded_mask(options, positions, shard)
    document = options.mask == "document"
    batch, seq_len = positions.shape
    if options.kernel == "sdpa":
        return dense_document_mask(positions) if document else None
    if options.kernel == "flex":
        if document:
            return FlexMask(document_block_mask(document_ids(positions)))
        return FlexMask(causal_block_mask(seq_len, positions.device))
    if document:
        return varlen_document_mask(positions)
    return varlen_causal_mask(batch, seq_len, positions.device)


def _sharded_mask(
    options: AttentionOptions, positions: torch.Tensor, shard: SequenceShardLike
) -> AttentionMask:
    """The rows of this rank's queries, against the keys of the whole (gathered) sequence."""
    if options.kernel == "varlen":
        raise ValueError("varlen attention does not run under context parallelism; use flex")
    if options.mask == "document":
        doc = document_ids(positions)
    else:
        doc = torch.zeros_like(positions, dtype=torch.int32)
    if options.kernel == "flex":
        return FlexMask(document_block_mask(doc, shard.index), shard.gather)
    q, kv = shard.index, torch.arange(doc.shape[1], device=doc.device)
    visible = (doc[:, q, None] == doc[:, None, :]) & (q[:, None] >= kv)
    return DenseMask(visible[:, None], shard.gather)


def dense_document_mask(positions: torch.Tensor) -> DenseMask:
    doc = document_ids(positions)
    seq_len = doc.shape[1]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=doc.device).tril()
    same = doc[:, :, None] == doc[:, None, :]
    return DenseMask((same & causal)[:, None])


def varlen_causal_mask(batch: int, seq_len: int, device) -> VarlenMask:
    cu = torch.arange(0, (batch + 1) * seq_len, seq_len, dtype=torch.int32, device=device)
    return VarlenMask(cu, seq_len)


def varlen_document_mask(positions: torch.Tensor) -> VarlenMask:
    flat = positions.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten().to(torch.int32)
    end = torch.tensor([flat.numel()], dtype=torch.int32, device=flat.device)
    cu = torch.cat([starts, end])
    return VarlenMask(cu, int((cu[1:] - cu[:-1]).max()))


def _block_lists(allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, q blocks, kv blocks) bool -> FlexAttention's count and index lists, one head."""
    counts = allowed.sum(-1, dtype=torch.int32)
    order = torch.argsort(allowed.to(torch.int8), dim=-1, descending=True, stable=True)
    return counts[:, None], order.to(torch.int32)[:, None]


def document_block_mask(
    doc: torch.Tensor, q_index: torch.Tensor | None = None, one_document: bool = False
):
    """BlockMask of document-causal attention from document ids ``doc`` (batch, kv_len).

    ``q_index`` (q_len,): the sequence index of each query (default: all of them, in order);
    each block of ``FLEX_BLOCK`` queries must be consecutive. A block pair is skipped when no
    query can see any key of it, and computed without the mask function when every query sees
    every key (one document on both sides, keys entirely before the queries).
    ``one_document``: ``doc`` is one all-zero row and the mask is plain causal (it then applies
    to any batch size).
    """
    from torch.nn.attention.flex_attention import BlockMask

    kv_len = doc.shape[1]
    gathered_queries = q_index is not None
    if q_index is None:
        q_index = torch.arange(kv_len, device=doc.device)
    q_len = q_index.numel()
    if kv_len % FLEX_BLOCK or q_len % FLEX_BLOCK:
        raise ValueError(f"FlexAttention needs sequence lengths divisible by {FLEX_BLOCK}")
    # Documents are contiguous, so a block's ids run from its first token's to its last's.
    k_first, k_last = doc[:, ::FLEX_BLOCK], doc[:, FLEX_BLOCK - 1 :: FLEX_BLOCK]
    q_doc = doc[:, q_index]
    q_first, q_last = q_doc[:, ::FLEX_BLOCK, None], q_doc[:, FLEX_BLOCK - 1 :: FLEX_BLOCK, None]
    q_start = q_index[::FLEX_BLOCK, None]
    q_end = q_index[FLEX_BLOCK - 1 :: FLEX_BLOCK, None]
    k_start = torch.arange(0, kv_len, FLEX_BLOCK, device=doc.device)[None]
    k_end = k_start + FLEX_BLOCK - 1
    shares_document = (k_last[:, None] >= q_first) & (k_first[:, None] <= q_last)
    any_visible = shares_document & (k_start <= q_end)
    all_visible = (k_first[:, None] == q_last) & (k_last[:, None] == q_first) & (k_end <= q_start)
    partial = any_visible & ~all_visible
    kv_counts, kv_indices = _block_lists(partial)
    full_counts, full_indices = _block_lists(all_visible)

    def document_causal(b, h, q, kv):
        return (doc[b, q] == doc[b, kv]) & (q >= kv)

    def gathered_document_causal(b, h, q, kv):  # queries are a CP rank's share of the sequence
        q_pos = q_index[q]
        return (doc[b, q_pos] == doc[b, kv]) & (q_pos >= kv)

    def causal(b, h, q, kv):
        return q >= kv

    if one_document:
        mask_mod = causal
    else:
        mask_mod = gathered_document_causal if gathered_queries else document_causal
    return BlockMask.from_kv_blocks(
        kv_counts,
        kv_indices,
        full_counts,
        full_indices,
        BLOCK_SIZE=FLEX_BLOCK,
        mask_mod=mask_mod,
        seq_lengths=(q_len, kv_len),
    )


def causal_block_mask(seq_len: int, device):
    """The causal BlockMask of one sequence length, for any batch size."""
    doc = torch.zeros(1, seq_len, dtype=torch.int32, device=device)
    return document_block_mask(doc, one_document=True)
