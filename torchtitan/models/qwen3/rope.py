"""Rotary position embedding in Hugging Face's rotate-half convention.

Frequency ``i`` rotates the pair ``(x[i], x[i + head_dim/2])`` of each head (Meta's Llama code
rotates ``(x[2i], x[2i+1])`` instead). Qwen3 checkpoints are trained this way, so their q/k
weights load without any permutation. The cache is Llama's: ``(positions, head_dim)`` holding
``cat(cos, sin)`` of each frequency, position first so context parallelism can shard it.
"""

from __future__ import annotations

import torch


def _rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), in float32 like the cache.
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


def apply_rope(
    xq: torch.Tensor, xk: torch.Tensor, rope_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate xq, xk of shape (bs, seqlen, heads, head_dim) by their position's angles:
    ``rope_cache`` is (positions, head_dim), whose first seqlen rows every sequence shares, or
    (bs, seqlen, head_dim), each sequence's own (decoding sequences at different positions)."""
    seqlen = xq.shape[1]
    if rope_cache.dim() == 2:
        if seqlen > rope_cache.shape[0]:
            raise ValueError(
                f"sequence length {seqlen} exceeds the RoPE cache length {rope_cache.shape[0]}; "
                "raise model.max_seq_len"
            )
        rope_cache = rope_cache[:seqlen][None]
    cos, sin = rope_cache.float().chunk(2, dim=-1)  # (bs, seqlen, head_dim / 2) each
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # broadcast over heads
    return _rotate_half(xq, cos, sin), _rotate_half(xk, cos, sin)
