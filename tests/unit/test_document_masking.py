"""Document masking's defining property, on CPU in fp32: inside a packed sequence, each
document's loss and gradients equal those of the same document fed alone.

A document's loss is the sum of the cross-entropy of every prediction made *from* one of its
tokens; its last token (EOS) predicts the next document's first token (BOS), so that boundary
label belongs to the ending document and is trained (the data loader never masks it)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
import torch.nn.functional as F

from torchtitan.config import ASSETS, ConfigError, parse_args
from torchtitan.data.loader import build_dataloader
from torchtitan.data.tokenizer import load_tokenizer
from torchtitan.models.common.attention import attention_problem
from torchtitan.models.common.masks import (
    FLEX_BLOCK,
    AttentionOptions,
    build_mask,
    dense_document_mask,
    document_block_mask,
    document_ids,
)
from torchtitan.models.deepseek_v3.flavors import get_model_args as deepseek_v3_args
from torchtitan.models.deepseek_v3.model import DeepSeekV3Transformer
from torchtitan.models.llama3 import ModelArgs, Transformer
from torchtitan.models.qwen3 import Qwen3Transformer, get_model_args
from torchtitan.parallel.context_parallel_documents import (
    computed_blocks_per_rank,
    sequence_index,
)
from torchtitan.preflight import check_job

SEQ = 48
DOC_LENGTHS = ([5, 17, 1, 25], [30, 9, 9])  # two packed rows of mixed lengths (sum SEQ)
TOLERANCE = 1e-6


def _llama(options: AttentionOptions) -> Transformer:
    args = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=96, max_seq_len=SEQ)
    return Transformer(dataclasses.replace(args, attention=options))


def _qwen3_moe(options: AttentionOptions) -> Qwen3Transformer:
    args = get_model_args(
        "debugmodel_moe", n_layers=2, vocab_size=96, max_seq_len=SEQ, attention=options
    )
    return Qwen3Transformer(args)


def _deepseek_v3(options: AttentionOptions) -> DeepSeekV3Transformer:
    args = deepseek_v3_args(
        "debugmodel", n_layers=2, vocab_size=96, max_seq_len=SEQ, attention=options
    )
    return DeepSeekV3Transformer(args)


BUILDERS = {"llama3": _llama, "qwen3_moe": _qwen3_moe, "deepseek_v3": _deepseek_v3}


def _model(family: str, mask: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = BUILDERS[family](AttentionOptions(mask=mask, reset_positions=True))
    model.init_weights()
    return model


def _packed_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token windows of SEQ + 1 tokens and the input positions of DOC_LENGTHS."""
    g = torch.Generator().manual_seed(1)
    windows = torch.randint(0, 96, (len(DOC_LENGTHS), SEQ + 1), generator=g)
    positions = torch.tensor(
        [[p for length in row for p in range(length)] for row in DOC_LENGTHS], dtype=torch.int32
    )
    return windows[:, :-1], windows[:, 1:], positions


def _loss_and_grads(model, inputs, labels, positions, keep: torch.Tensor):
    """Summed loss over the predictions where ``keep`` is set, and every parameter's grad."""
    model.zero_grad()
    logits = model(inputs, positions=positions)
    losses = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
    loss = losses[keep.flatten()].sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _documents():
    """(row, start, length) of every packed document."""
    for row, lengths in enumerate(DOC_LENGTHS):
        start = 0
        for length in lengths:
            yield row, start, length
            start += length


def _worst_relative_error(model) -> float:
    inputs, labels, positions = _packed_batch()
    doc = document_ids(positions)
    worst = 0.0
    for row, start, length in _documents():
        keep = torch.zeros_like(labels, dtype=torch.bool)
        keep[row, start : start + length] = True
        packed_loss, packed_grads = _loss_and_grads(model, inputs, labels, positions, keep)
        span = slice(start, start + length)
        alone = (inputs[row : row + 1, span], labels[row : row + 1, span])
        alone_positions = positions[row : row + 1, span]
        alone_keep = torch.ones_like(alone[1], dtype=torch.bool)
        alone_loss, alone_grads = _loss_and_grads(model, *alone, alone_positions, alone_keep)
        assert doc[row, start] == doc[row, start + length - 1]
        worst = max(worst, ((packed_loss - alone_loss).abs() / alone_loss.abs()).item())
        # Relative to the whole gradient: some parameters' gradients are exactly zero in theory
        # (a one-token document's keys), rounding noise on both sides.
        packed = torch.cat([g.flatten() for g in packed_grads.values()])
        alone = torch.cat([alone_grads[n].flatten() for n in packed_grads])
        worst = max(worst, ((packed - alone).norm() / alone.norm()).item())
    return worst


@pytest.mark.parametrize("family", list(BUILDERS))
def test_each_packed_document_trains_as_if_alone(family):
    assert _worst_relative_error(_model(family, "document")) < TOLERANCE


def test_causal_masking_lets_documents_see_each_other():
    # The same comparison fails without document masking: the check can fail.
    assert _worst_relative_error(_model("llama3", "causal")) > 1e-3


@pytest.mark.parametrize("recipe, apart", [("rowwise", True), ("tensorwise", False)])
def test_float8_with_document_masking(recipe, apart):
    """Float8 (emulated) composes with document masking: with rowwise scales (one per token) a
    document's logits inside a packed batch are those of the document alone; tensorwise scales
    are shared by the whole batch, so its neighbours move a document's logits by float8 rounding
    (about 1e-3 here), not by attention."""
    from tests.unit.test_float8_backward import llama_float8
    from torchtitan.config import Float8

    model = _model("llama3", "document")
    llama_float8(model, Float8(enable=True, emulate=True, recipe=recipe))
    inputs, _, positions = _packed_batch()
    worst = 0.0
    with torch.no_grad():
        packed = model(inputs, positions=positions)
        for row, start, length in _documents():
            span = slice(start, start + length)
            alone = model(inputs[row : row + 1, span], positions=positions[row : row + 1, span])
            error = (packed[row, span] - alone[0]).norm() / alone.norm()
            worst = max(worst, error.item())
    assert worst < TOLERANCE if apart else TOLERANCE * 100 < worst < 1e-2


def test_dense_mask_is_document_causal():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0]])
    allowed = build_mask(AttentionOptions(mask="document"), positions).allowed[0, 0]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [0, 0, 0, 1, 0, 0],
            [0, 0, 0, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, expected)


def _block_pairs(counts: torch.Tensor, indices: torch.Tensor) -> set[tuple[int, int, int]]:
    """(batch, q block, kv block) of a BlockMask's count and index lists."""
    return {
        (b, q, int(indices[b, 0, q, i]))
        for b in range(counts.shape[0])
        for q in range(counts.shape[2])
        for i in range(int(counts[b, 0, q]))
    }


@pytest.mark.parametrize("cp_rank", [None, 0, 1])
def test_flex_block_mask_means_the_dense_mask(cp_rank):
    """Element by element the BlockMask's mask function is document-causal; a skipped block pair
    holds no visible key, a full one only visible keys, a partial one some (CP2 rank 0 or 1:
    its queries are the rank's share of the sequence, looked up through an index)."""
    from torch.nn.attention.flex_attention import create_mask

    seq = 8 * FLEX_BLOCK
    lengths = ([100, 300, 1, 500, 123], [1024], [128, 128, 600, 168])
    positions = torch.cat([torch.cat([torch.arange(n) for n in row])[None] for row in lengths])
    dense = dense_document_mask(positions).allowed[:, 0]
    q_index = None if cp_rank is None else sequence_index(seq, cp_rank, 2)
    if q_index is not None:
        dense = dense[:, q_index]
    mask = document_block_mask(document_ids(positions), q_index)
    elements = create_mask(mask.mask_mod, len(lengths), 1, dense.shape[1], seq)[:, 0]
    assert torch.equal(elements, dense)
    blocks = dense.unflatten(1, (-1, FLEX_BLOCK)).unflatten(3, (-1, FLEX_BLOCK))
    visible = blocks.any(dim=(2, 4))  # (batch, q block, kv block)
    full = blocks.all(dim=(2, 4))
    partial = _block_pairs(mask.kv_num_blocks, mask.kv_indices)
    complete = _block_pairs(mask.full_kv_num_blocks, mask.full_kv_indices)
    assert complete == {tuple(i) for i in full.nonzero().tolist()}
    assert partial == {tuple(i) for i in (visible & ~full).nonzero().tolist()}


@pytest.mark.parametrize(
    "kernel, seq_len, cp, cuda, dtype, message",
    [
        ("flex", 8192, 1, False, "bfloat16", "needs a CUDA GPU"),
        ("varlen", 8192, 1, False, "bfloat16", "needs a CUDA GPU"),
        ("flex", 8000, 1, True, "bfloat16", "divisible by 128"),
        ("flex", 8192 + 256, 2, True, "bfloat16", "divisible by 512"),
        ("varlen", 8192, 2, True, "bfloat16", "context parallelism; use --model.attention flex"),
        ("varlen", 8192, 1, True, "float32", "bf16 only"),
    ],
)
def test_bad_attention_choices_are_one_line_errors(kernel, seq_len, cp, cuda, dtype, message):
    options = AttentionOptions(kernel, "document")
    problem = attention_problem(options, seq_len, cp, cuda, dtype)
    assert message in problem and "\n" not in problem
    assert attention_problem(AttentionOptions("sdpa", "document"), seq_len, cp, cuda, dtype) is None


def test_preflight_names_the_kernel_on_cpu():
    with pytest.raises(ConfigError, match="--model.attention flex needs a CUDA GPU"):
        check_job(parse_args(["--model.attention", "flex", "--model.mask", "document"]), 1)


def test_context_parallel_shares_are_a_partition_of_the_sequence():
    for seq_len, cp in ((64, 2), (8192, 4), (1024, 2)):
        held = torch.cat([sequence_index(seq_len, rank, cp) for rank in range(cp)])
        assert torch.equal(held.sort().values, torch.arange(seq_len))
        assert all(sequence_index(seq_len, r, cp).numel() == seq_len // cp for r in range(cp))


def test_context_parallel_attention_work_is_even_on_the_bundled_corpus():
    """CP4 at seq 8192, 8 samples per step: the FlexAttention blocks each rank computes are
    within 10 % of the mean in every one of the first 4 steps."""
    tokenizer = load_tokenizer(str(ASSETS / "tokenizer.model"))
    loader = build_dataloader("sample", tokenizer, 8192, 8, 0, 1, with_positions=True)
    for batch in itertools.islice(iter(loader), 4):
        blocks = computed_blocks_per_rank(batch.positions, 4)
        assert max(blocks) / (sum(blocks) / 4) <= 1.1, blocks
