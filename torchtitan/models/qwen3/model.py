"""Qwen3 decoder-only transformer, dense or mixture-of-experts.

Laid out like Llama 3 (torchtitan/models/llama3/model.py) so the shared composition applies:
``tok_embeddings``, ``layers`` (keyed "0".."n-1"), ``norm``, ``output`` and the ``rope_cache``
buffer; per block ``attention_norm``, ``attention`` (wq, wk, wv, wo), ``ffn_norm`` and either
``feed_forward`` (SwiGLU w1, w2, w3) or ``moe``. What Qwen3 adds: an RMSNorm over each query and
key head before RoPE (``q_norm``, ``k_norm``), rotate-half RoPE, head_dim independent of dim,
and optionally the output head tied to the embedding table.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from torchtitan.models.common.masks import AttentionMask, SequenceShardLike
from torchtitan.models.common.moe import MoE
from torchtitan.models.llama3.kv_cache import KVCache, LayerKVCache
from torchtitan.models.llama3.model import (
    INIT_STD,
    FeedForward,
    RMSNorm,
    in_autocast_dtype,
    precompute_rope_cache,
    rope_and_mask,
    trunc_normal,
)
from torchtitan.models.llama3.model import Attention as LlamaAttention
from torchtitan.models.qwen3.args import Qwen3Args
from torchtitan.models.qwen3.rope import apply_rope


class Attention(LlamaAttention):
    """Llama's attention (GQA, SDPA, the KV-cache path) with ``head_dim`` from the args and
    each query and key head RMS-normalized before RoPE, which is Hugging Face's rotate-half."""

    def __init__(self, args: Qwen3Args):
        super().__init__(args)
        # One weight over head_dim shared by every head: under tensor parallelism they act on
        # each rank's own heads unchanged.
        self.q_norm = RMSNorm(self.head_dim, eps=args.norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=args.norm_eps)

    def rotated_qkv(
        self, x: torch.Tensor, rope_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of x, (bs, seqlen, heads, head_dim) each; queries and keys
        normalised per head, then rotated by their positions' RoPE angles."""
        bs, seqlen, _ = x.shape
        # -1, not n_heads: under tensor parallelism each rank holds only its share of the heads.
        xq = self.q_norm(self.wq(x).view(bs, seqlen, -1, self.head_dim))
        xk = self.k_norm(self.wk(x).view(bs, seqlen, -1, self.head_dim))
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rope(xq, xk, rope_cache)
        return xq, xk, xv

    def init_weights(self, out_std: float) -> None:
        super().init_weights(out_std)
        self.q_norm.reset_parameters()
        self.k_norm.reset_parameters()


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: Qwen3Args):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.is_moe = args.moe is not None
        if self.is_moe:
            self.moe = MoE(args.dim, args.moe)
        else:
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
        ffn = self.moe if self.is_moe else self.feed_forward
        return h + ffn(self.ffn_norm(h))

    def init_weights(self) -> None:
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.attention.init_weights(self.out_init_std)
        if self.is_moe:
            self.moe.init_weights(INIT_STD, self.out_init_std)
        else:
            self.feed_forward.init_weights(self.out_init_std)


class Qwen3Transformer(nn.Module):
    def __init__(self, args: Qwen3Args):
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
        self.tie_weights()
        # True: forward stops before the head and returns the final hidden states, for a loss
        # that applies ``output.weight`` itself (the fused, chunked head + cross-entropy).
        self.defer_head = False
        self.register_buffer("rope_cache", self._rope_cache(), persistent=False)

    def tie_weights(self) -> None:
        """With ``tie_embeddings``, make the head use the embedding table's Parameter: one
        Parameter under two names (named_parameters() lists it once, as tok_embeddings.weight;
        state_dict() under both). Replacing parameters module by module (``to_empty``) unties
        them, so ``init_rope_cache`` and ``init_weights`` call this again. A no-op on a pipeline
        stage holding only one of the two."""
        emb, out = self.tok_embeddings, self.output
        if self.args.tie_embeddings and emb is not None and out is not None:
            if out.weight is not emb.weight:
                out.weight = emb.weight

    def _rope_cache(self) -> torch.Tensor:
        a = self.args
        return precompute_rope_cache(a.head_dim, a.max_seq_len, a.rope_theta)

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
        Inference: with ``cache`` (llama3's ``KVCache``, built from these args), tokens are
        positions ``start_pos ...`` of sequences whose earlier positions the cache holds.
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
        """Recompute the (float32) RoPE cache, on buffer_device or where the buffer is, and
        re-tie tied embeddings: all a model needs besides its parameters' values, e.g. after
        `to_empty()` and before loading them."""
        self.tie_weights()
        with torch.device(buffer_device or self.rope_cache.device):
            self.rope_cache = self._rope_cache()

    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """Initialise every parameter and recompute the RoPE cache, e.g. after `to_empty()`.

        Untied, the embedding table is N(0, 1) and the head N(0, 1/dim) as in Llama. A tied
        table serves both roles, so it takes the head's std: N(0, 1) would make the initial
        logits O(sqrt(dim)), while as an embedding the small scale is harmless because every
        block reads the residual stream through an RMSNorm.
        """
        head_std = self.args.dim**-0.5
        with torch.no_grad():
            self.init_rope_cache(buffer_device)
            if self.tok_embeddings is not None:
                if self.args.tie_embeddings:
                    trunc_normal(self.tok_embeddings.weight, head_std)
                else:
                    nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=1.0)
            for layer in self.layers.values():
                layer.init_weights()
            if self.norm is not None:
                self.norm.reset_parameters()
            if self.output is not None and not self._output_is_embedding():
                trunc_normal(self.output.weight, head_std)

    def _output_is_embedding(self) -> bool:
        """Whether the head's weight is the embedding table's very tensor (tied, both here)."""
        emb = self.tok_embeddings
        return emb is not None and self.output is not None and self.output.weight is emb.weight
