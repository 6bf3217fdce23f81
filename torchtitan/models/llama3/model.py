"""Llama 3 decoder-only transformer.

Built to be sharded afterwards: tensor parallelism refers to the module names below, a pipeline
split deletes entries of `layers` and sets `tok_embeddings`/`norm`/`output` to None, and context
parallelism shards the `rope_cache` buffer along its first (sequence) dimension.

Inference passes a ``KVCache`` (kv_cache.py) and the position of the first token; training calls
``model(tokens)`` and never reaches that path.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from torchtitan.models.common.attention import attend
from torchtitan.models.common.masks import (
    AttentionMask,
    AttentionOptions,
    DenseMask,
    SequenceShardLike,
    build_mask,
)
from torchtitan.models.llama3.args import ModelArgs
from torchtitan.models.llama3.kv_cache import KVCache, LayerKVCache, cached_attention_mask

# Llama 3.1 RoPE scaling constants (the factor itself is ModelArgs.rope_scaling_factor).
ROPE_LOW_FREQ_FACTOR = 1.0
ROPE_HIGH_FREQ_FACTOR = 4.0
ROPE_OLD_CONTEXT_LEN = 8192

INIT_STD = 0.02  # std of every projection that reads from the residual stream


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fp32 statistics, output in x's dtype, times the weight. torch's op rather than the same
        # formula written out (pow, mean, rsqrt): recomputed under selective AC, the written-out
        # form was fused with the float8 cast of its output into one slow transposing reduction
        # kernel (1.75 ms per Llama 3 8B block backward on H200; docs/performance.md).
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def trunc_normal(w: torch.Tensor, std: float) -> None:
    # In place, so it also works on DTensor parameters (each rank fills its own shard).
    nn.init.trunc_normal_(w, mean=0.0, std=std, a=-3 * std, b=3 * std)


def rope_frequencies(
    head_dim: int, theta: float, scaling: bool = False, scaling_factor: float = 8.0
) -> torch.Tensor:
    """Angular frequency of each of the head_dim // 2 rotated pairs (float64)."""
    freqs = theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if not scaling:
        return freqs
    # Llama 3.1: leave short wavelengths alone, divide long ones by the factor, and interpolate
    # smoothly in between.
    wavelen = 2 * math.pi / freqs
    smooth = (ROPE_OLD_CONTEXT_LEN / wavelen - ROPE_LOW_FREQ_FACTOR) / (
        ROPE_HIGH_FREQ_FACTOR - ROPE_LOW_FREQ_FACTOR
    )
    smooth = smooth.clamp(0.0, 1.0)  # 1 for wavelen < old_len / high, 0 for wavelen > old_len / low
    return (1 - smooth) * freqs / scaling_factor + smooth * freqs


def precompute_rope_cache(
    head_dim: int,
    end: int,
    theta: float = 500000.0,
    scaling: bool = False,
    scaling_factor: float = 8.0,
) -> torch.Tensor:
    """(end, head_dim) float32 table: cat(cos, sin) of position * frequency for each pair.

    Position is the first dimension so context parallelism can shard the buffer along it.
    """
    freqs = rope_frequencies(head_dim, theta, scaling, scaling_factor)
    # Angles in float64: at position 1e5 a float32 angle would be off by ~1e-2 rad.
    angles = torch.outer(torch.arange(end, dtype=torch.float64), freqs)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Meta's convention: (x[2i], x[2i+1]) is rotated as one complex number x[2i] + i*x[2i+1]:
    # (x0 cos - x1 sin, x1 cos + x0 sin) = x * (cos, cos) + (x1, x0) * (-sin, sin). Written with
    # the pair swap rather than unbinding and stacking the pairs, its backward is pointwise too:
    # the stacked form's backward scattered into zeros, and the compiled bf16 block ran 0.5-1.1%
    # slower on an H200 (docs/performance.md).
    xf = x.float()
    swapped = xf.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return (xf * cos + swapped * sin).type_as(x)


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
    cos, sin = rope_cache.float().chunk(2, dim=-1)
    cos = cos.repeat_interleave(2, dim=-1)  # each pair's angle for both of its entries
    sin = torch.stack([-sin, sin], dim=-1).flatten(-2)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # broadcast over heads
    return _rotate_pairs(xq, cos, sin), _rotate_pairs(xk, cos, sin)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def rotated_qkv(
        self, x: torch.Tensor, rope_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of x, (bs, seqlen, heads, head_dim) each; queries and keys
        rotated by their positions' RoPE angles (rope_cache's first seqlen rows)."""
        bs, seqlen, _ = x.shape
        # -1, not n_heads: under tensor parallelism each rank holds only its share of the heads.
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rope(xq, xk, rope_cache)
        return xq, xk, xv

    def forward(
        self,
        x: torch.Tensor,
        rope_cache: torch.Tensor,
        kv_cache: LayerKVCache | None = None,
        start_pos: int = 0,
        mask: AttentionMask = None,
    ) -> torch.Tensor:
        """``mask``: which earlier tokens each token sees (masks.py; None: all of them). With
        ``kv_cache``, x holds positions ``start_pos ...`` (rope_cache starts there too) and
        attends to every earlier position stored in the cache."""
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.rotated_qkv(x, rope_cache)
        if kv_cache is not None:
            xk, xv = kv_cache.update(xk, xv, start_pos)
            if start_pos > 0:
                mask = DenseMask(cached_attention_mask(seqlen, start_pos, x.device))
        out = attend(xq, xk, xv, mask)
        return self.wo(out.reshape(bs, seqlen, -1))

    def init_weights(self, out_std: float) -> None:
        for w in (self.wq, self.wk, self.wv):
            trunc_normal(w.weight, INIT_STD)
        trunc_normal(self.wo.weight, out_std)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, out_std: float) -> None:
        trunc_normal(self.w1.weight, INIT_STD)
        trunc_normal(self.w3.weight, INIT_STD)
        trunc_normal(self.w2.weight, out_std)


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)
        # Std of the projections that write into the residual stream (wo, w2): scaled down so
        # the residual's variance does not grow with depth.
        depth = layer_id + 1 if args.depth_init else args.n_layers
        self.out_init_std = INIT_STD / math.sqrt(2 * depth)

    def forward(
        self,
        x: torch.Tensor,
        rope_cache: torch.Tensor,
        kv_cache: LayerKVCache | None = None,
        start_pos: int = 0,
        mask: AttentionMask = None,
    ) -> torch.Tensor:
        # The cache and mask by keyword: a TP plan's PrepareModuleInput lays out the positional
        # inputs only (hidden states, RoPE cache).
        attention_in = self.attention_norm(x)
        h = x + self.attention(
            attention_in, rope_cache, kv_cache=kv_cache, start_pos=start_pos, mask=mask
        )
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self) -> None:
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.attention.init_weights(self.out_init_std)
        self.feed_forward.init_weights(self.out_init_std)


def in_autocast_dtype(h: torch.Tensor) -> torch.Tensor:
    """The residual stream in autocast's dtype, as under FSDP's mixed precision.

    The trainer runs bf16 autocast over fp32 weights where no FSDP casts (GPU layouts without
    data parallelism). Autocast leaves the embedding's output in float32, and every residual add
    would keep it there: float32 block inputs saved for backward and read and written at twice
    the bytes by the norms and adds (docs/performance.md)."""
    device = h.device.type
    if h.is_floating_point() and torch.is_autocast_enabled(device):
        return h.to(torch.get_autocast_dtype(device))
    return h


def rope_and_mask(
    options: AttentionOptions,
    rope_cache: torch.Tensor,
    positions: torch.Tensor | None,
    shard: SequenceShardLike | None = None,
) -> tuple[torch.Tensor, AttentionMask]:
    """The RoPE angles and the attention mask of a batch whose tokens have ``positions``.

    The angles are the cache's first rows, or each token's own row when positions restart at
    every document or the tokens are a context-parallel rank's share of the sequence (``shard``:
    ``positions`` then covers the whole sequence)."""
    mask = build_mask(options, positions, shard)
    if options.reset_positions:
        rows = positions if shard is None else positions[:, shard.index]
        return rope_cache[rows], mask
    return (rope_cache if shard is None else rope_cache[shard.index]), mask


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        args.validate()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        # A dict keyed by the original index, so a pipeline stage keeps the full model's FQNs.
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(i, args) for i in range(args.n_layers)}
        )
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # True: forward stops before the head and returns the final hidden states, for a loss
        # that applies ``output.weight`` itself (the fused, chunked head + cross-entropy).
        self.defer_head = False
        self.register_buffer("rope_cache", self._rope_cache(), persistent=False)

    def _rope_cache(self) -> torch.Tensor:
        a = self.args
        return precompute_rope_cache(
            a.head_dim, a.max_seq_len, a.rope_theta, a.rope_scaling, a.rope_scaling_factor
        )

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        start_pos: int = 0,
        positions: torch.Tensor | None = None,
        sequence_shard: SequenceShardLike | None = None,
    ) -> torch.Tensor:
        """tokens (bs, seqlen) int -> logits (bs, seqlen, vocab_size).

        ``positions`` (bs, seqlen): each token's position in its document (0 where one starts),
        for document masking and per-document RoPE (``args.attention``). ``sequence_shard``:
        tokens are a context-parallel rank's share of the sequence (``positions`` is whole).
        In a pipeline stage without tok_embeddings the input is hidden states (bs, seqlen, dim),
        and without output (or with ``defer_head``) the model returns the hidden states.
        Inference: with ``cache``, tokens are positions ``start_pos ...`` of the sequences whose
        earlier positions the cache holds (a prompt at 0, then one token at a time); their
        keys/values are added to it.
        """
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        h = in_autocast_dtype(h)
        if cache is not None:
            return self._head(self._cached_layers(h, cache, start_pos))
        rope, mask = rope_and_mask(self.args.attention, self.rope_cache, positions, sequence_shard)
        for layer in self.layers.values():
            h = layer(h, rope, mask=mask)
        return self._head(h)

    def _cached_layers(self, h: torch.Tensor, cache: KVCache, start_pos: int) -> torch.Tensor:
        seqlen = h.shape[1]
        cache.check_fits(start_pos, seqlen)
        rope = self.rope_cache[start_pos : start_pos + seqlen]
        for name, layer in self.layers.items():
            h = layer(h, rope, cache.layers[name], start_pos)
        return h

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None and not self.defer_head else h

    def init_rope_cache(self, buffer_device: torch.device | None = None) -> None:
        """Recompute the (float32) RoPE cache, on buffer_device or where the buffer is: all a
        model needs besides its parameters, e.g. after `to_empty()` and before loading them."""
        with torch.device(buffer_device or self.rope_cache.device):
            self.rope_cache = self._rope_cache()

    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """Initialise every parameter and recompute the RoPE cache, e.g. after `to_empty()`.

        buffer_device: where to put the RoPE cache (default: where the buffer already is).
        """
        with torch.no_grad():
            self.init_rope_cache(buffer_device)
            if self.tok_embeddings is not None:
                nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=1.0)
            for layer in self.layers.values():
                layer.init_weights()
            if self.norm is not None:
                self.norm.reset_parameters()
            if self.output is not None:
                trunc_normal(self.output.weight, self.args.dim**-0.5)
