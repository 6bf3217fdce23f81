"""Bytes a transformer block saves for backward, per token, for each activation-checkpointing
mode; and the bytes the output head and the loss hold.

The table below lists what a compiled bf16 Llama block keeps between its forward and backward
(regional compile, SDPA flash attention with native GQA). It reproduces the measurements of
``python -m torchtitan.planning.measure`` on an H100 with torch 2.11 exactly (KiB per token per
block; Llama 3.2 1B / 3.1 8B): no AC 74.13 / 136.13, selective op keeping all matmuls
50.12 / 92.12, every other matmul 29.12 / 54.12, full AC 4.0 / 8.0.

Float8 linears (compiled blocks): a tensor whose only users are float8 linears is not saved; the
compiler saves the tensors it is recomputed from (norm input and 1/RMS, w1 and w3 outputs) and
redoes the pointwise float8 cast in backward. Selective AC saves matmul outputs, not inputs, so
it keeps the same bytes as bf16. (CPU, ``saved_tensors_hooks`` on a compiled block with
torchao's emulated float8, 2026-11-26: 1B AC off 74.13 -> 54.13 KiB with wk/wv in bf16, 50.13
with all seven float8; selective all unchanged; docs/planning.md.) Our float8 backwards keep the
same: their casts are recomputed in the backward (``torchtitan.float8.recompute``;
tests/unit/test_float8_backward.py).
"""

from __future__ import annotations

import functools

from torchtitan.models.llama3 import ModelArgs
from torchtitan.planning import calibration as cal
from torchtitan.planning import moe
from torchtitan.planning.shapes import Shapes, shapes

# (saved tensor, width per token, sharded by TP, the modes that keep it, the linears that use
# it). Widths are names of Shapes fields. Under TP, "sharded" tensors hold 1/tp of their width
# (heads, FFN columns, or the sequence for the SP residual stream); the others are full (the
# all-gathered norm outputs). Compiled selective AC drops the saved matmul outputs no backward
# needs (w2's; wo's under TP, where the reduce-scatter output is kept instead). A tensor used
# only by linears that all run in float8 is recomputed instead (compiled, TP 1). In a MoE block
# the FFN rows are 0 wide (ffn 0) and the ffn norm output is the MoE layer's input on the TP
# sequence shard, not gathered; what the MoE layer keeps is moe.saved_bytes_per_token.
BLOCK_TENSORS = (
    ("block input x", "dim", True, {"none", "all", "alternate", "full"}, ()),
    ("attention norm output (gathered)", "dim", False, {"none"}, ("wq", "wk", "wv")),
    ("wq output q", "q", True, {"none", "all", "alternate"}, ()),
    ("wk output k", "kv", True, {"none", "all"}, ()),
    ("wv output v", "kv", True, {"none", "all", "alternate"}, ()),
    ("attention output", "q", True, {"none", "all", "alternate"}, ()),  # SDPA's backward too
    ("wo output / its reduce-scatter, h", "dim", True, {"none", "all"}, ()),
    ("ffn norm output (gathered)", "dim", False, {"none"}, ("w1", "w3")),
    ("w1 output", "ffn", True, {"none", "all", "alternate"}, ()),
    ("w3 output", "ffn", True, {"none", "all"}, ()),
    ("w2 input silu(w1) * w3", "ffn", True, {"none"}, ("w2",)),
)
# fp32 extras per token: attention logsumexp (one per head), the two RMSNorms' 1/RMS.
FP32_EXTRAS = {"none": ("heads", 2), "all": ("heads",), "alternate": ("heads",)}


def ac_kind(ac_mode: str, save_matmuls: str) -> str:
    """The BLOCK_TENSORS mode of a config's AC mode (every-N handled by the caller)."""
    if ac_mode == "selective":
        return "alternate" if save_matmuls == "alternate" else "all"
    return ac_mode


def block_bytes_per_token(
    model: ModelArgs | Shapes,
    kind: str,
    tp: int = 1,
    cp: int = 1,
    bf16: bool = True,
    autocast: bool = False,
    compiled: bool = True,
    float8: frozenset[str] = frozenset(),
    ep: int = 1,
) -> float:
    """Bytes one block keeps for backward per token of this rank's (sequence) share.

    autocast: one GPU without FSDP (fp32 weights). The residual stream is bf16 there too: the
    model casts the embedding's output to autocast's dtype.
    cp > 1: ring attention also keeps about the K/V of the other CP ranks (none and selective
    modes; calibration.CP_SAVED_KV). float8: the block linears that run in float8. ep: the
    expert parallel degree (MoE blocks).
    """
    return _block_bytes(shapes(model), kind, tp, cp, bf16, autocast, compiled, float8, ep)


def _recomputed_for_float8(users: tuple, float8: frozenset, tp: int, compiled: bool) -> bool:
    return bool(users) and compiled and tp == 1 and float8.issuperset(users)


@functools.lru_cache(maxsize=4096)
def _block_bytes(w: Shapes, kind, tp, cp, bf16, autocast, compiled, float8, ep=1) -> float:
    act = 2 if bf16 else 4
    total = 0.0
    for name, width, sharded, modes, users in BLOCK_TENSORS:
        sharded = sharded or (w.experts > 0 and name.startswith("ffn norm"))
        share = getattr(w, width) / (tp if sharded else 1)
        if kind in modes and not _recomputed_for_float8(users, float8, tp, compiled):
            total += act * share
    for extra in FP32_EXTRAS.get(kind, ()):
        total += 4 * (getattr(w, extra) if isinstance(extra, str) else extra) / tp
    if tp > 1 and kind in ("all", "alternate"):
        # Collectives are not recomputed: the sequence-gathered norm outputs stay saved (a MoE
        # block gathers only the attention's), and so does wo's reduce-scatter output where
        # alternate recomputes wo itself.
        gathered = 1 if w.experts else 2
        total += gathered * act * w.dim + (act * w.dim / tp if kind == "alternate" else 0)
    if kind != "full" and cp > 1:
        total += cal.CP_SAVED_KV * (cp - 1) * 2 * act * w.kv / tp
    if not compiled and kind == "none":
        total += (act * w.ffn + 8 * w.dim) / tp  # eager: silu output, fp32 norm internals
    elif not compiled and kind != "full":
        total += act * w.dim / tp  # eager SAC keeps w2's output too
    return total + moe.saved_bytes_per_token(w, kind, tp, ep, act)


def recompute_bytes_per_token(model: ModelArgs | Shapes, kind: str, **kwargs) -> float:
    """Transient peak while one checkpointed block recomputes and runs its backward."""
    if kind == "none":
        return 0.0
    return block_bytes_per_token(model, "none", **kwargs) - block_bytes_per_token(
        model, kind, **kwargs
    )


def block_fixed_bytes(
    model: ModelArgs | Shapes,
    kind: str,
    autocast: bool,
    tp: int = 1,
    float8: frozenset[str] = frozenset(),
    ep: int = 1,
) -> float:
    """Per-block bytes that do not scale with tokens: under autocast without AC, the bf16 copies of
    the block's weights that its matmuls save (selective AC recomputes the casts); float8 linears
    cast their fp32 weights again in backward instead. A MoE layer's grouped GEMMs save the bf16
    copies of the experts a rank runs (its ep slice), not split by TP."""
    if not autocast or kind != "none":
        return 0.0
    w = shapes(model)
    kept = w.block_params - sum(n for name, n in w.linears.items() if name in float8)
    return 2 * kept / tp + 2 * moe.gathered_params(w, ep)


# ---------------------------------------------------------------------------- head and loss

# Bytes per token per vocabulary entry (measured, bf16 logits held by the trainer):
# eager loss: bf16 logits 2 + fp32 log-softmax 4 held; backward adds its fp32 gradient, the
# gradient of the fp32 copy and its cast: peak 14. Compiled loss: logits 2 + bf16 gradient 2.
# In place (torchtitan.kernels.inplace_loss): the gradient is written over the logits. Compiled
# under TP's loss parallel (DTensor logits sharded over the vocabulary) the standard loss holds
# more than the whole-vocabulary compiled one: 7.5 bytes above the logits at the peak (one
# point: 1B TP2 AC off, 30.58 GiB against the in-place loss's 23.00; 2x H200, 2026-11-28).
LOSS_BYTES_PER_VOCAB = {
    "eager": (2.0, 12.0),
    "compiled": (2.0, 2.0),
    "in_place": (2.0, 0.0),
    "compiled_loss_parallel": (2.0, 7.5),
}
FINAL_NORM_BYTES_PER_DIM = 8  # eager final RMSNorm (fp32 internals) + the head's bf16 input


def loss_peak_bytes_per_token(
    model: ModelArgs | Shapes,
    loss_kind: str,
    vocab_shards: int = 1,
    bf16: bool = True,
) -> float:
    """Peak bytes of final norm + head output + loss forward/backward, per token (``loss_kind``
    one of LOSS_BYTES_PER_VOCAB's)."""
    logits, loss_part = LOSS_BYTES_PER_VOCAB[loss_kind]
    if not bf16:  # fp32 logits; in place, their gradient still takes no second tensor
        logits, loss_part = 4.0, (loss_part + 4.0 if loss_part else 0.0)
    w = shapes(model)
    return w.vocab / vocab_shards * (logits + loss_part) + (FINAL_NORM_BYTES_PER_DIM * w.dim)
