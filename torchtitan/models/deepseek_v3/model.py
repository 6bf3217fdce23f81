"""DeepSeek-V3 decoder-only transformer: multi-head latent attention (MLA), the first
``n_dense_layers`` blocks with a dense SwiGLU and the rest with a Mixture-of-Experts layer
(``torchtitan.models.common.moe``, shared experts included).

Laid out like Llama 3 (torchtitan/models/llama3/model.py) so the shared composition applies:
``tok_embeddings``, ``layers`` (keyed "0".."n-1"), ``norm``, ``output`` and the ``rope_cache``
buffer; per block ``attention_norm``, ``attention``, ``ffn_norm`` and either ``feed_forward``
(w1, w2, w3) or ``moe``.

MLA: ``wq`` makes the heads' queries, from the block input or, with ``q_lora_rank`` > 0, from a
low-rank latent (``wq_a`` and its RMSNorm ``q_norm``); keys and values from one latent of
``kv_lora_rank``
(``wkv_a``, its RMSNorm ``kv_norm``, ``wkv_b``). ``wkv_a`` also yields the RoPE part of the key,
one for all heads; each head concatenates it to its own non-rotated part.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from torchtitan.models.common.attention import attend
from torchtitan.models.common.masks import AttentionMask, SequenceShardLike
from torchtitan.models.common.moe import MoE
from torchtitan.models.deepseek_v3.args import DeepSeekV3Args
from torchtitan.models.deepseek_v3.rope import precompute_rope_cache, softmax_scale
from torchtitan.models.llama3.model import (
    INIT_STD,
    FeedForward,
    RMSNorm,
    apply_rope,
    in_autocast_dtype,
    rope_and_mask,
    trunc_normal,
)


class SequenceGather(nn.Identity):
    """An identity on the RoPE key (bs, seqlen, qk_rope_head_dim). Under tensor parallelism
    the latents are computed on each rank's sequence shard, and the TP plan gathers this one
    over the sequence here (``wq`` and ``wkv_b`` gather theirs themselves)."""


class Attention(nn.Module):
    """Multi-head latent attention (see the module docstring), causal, SDPA."""

    def __init__(self, args: DeepSeekV3Args):
        super().__init__()
        self.qk_nope_head_dim, self.v_head_dim = args.qk_nope_head_dim, args.v_head_dim
        self.qk_rope_head_dim, self.kv_lora_rank = args.qk_rope_head_dim, args.kv_lora_rank
        self.qk_head_dim = args.qk_head_dim
        self.q_lora_rank = args.q_lora_rank
        linears = args.attention_linears()
        if self.q_lora_rank:
            self.wq_a = nn.Linear(*linears["wq_a"], bias=False)
            self.q_norm = RMSNorm(self.q_lora_rank, eps=args.norm_eps)
        self.wq = nn.Linear(*linears["wq"], bias=False)
        self.wkv_a = nn.Linear(*linears["wkv_a"], bias=False)
        self.kv_norm = RMSNorm(self.kv_lora_rank, eps=args.norm_eps)
        self.wkv_b = nn.Linear(*linears["wkv_b"], bias=False)
        self.wo = nn.Linear(*linears["wo"], bias=False)
        self.rope_key = SequenceGather()
        self.scale = softmax_scale(args)

    def _query(self, x: torch.Tensor) -> torch.Tensor:
        """(bs, seqlen, heads, qk_head_dim); heads = this rank's under tensor parallelism."""
        latent = self.q_norm(self.wq_a(x)) if self.q_lora_rank else x
        return self.wq(latent).unflatten(-1, (-1, self.qk_head_dim))

    def forward(
        self, x: torch.Tensor, rope_cache: torch.Tensor, mask: AttentionMask = None
    ) -> torch.Tensor:
        # Sequence lengths come from each projection's output, not from x: under tensor
        # parallelism x is this rank's sequence shard and the up-projections gather the sequence.
        q_nope, q_rope = self._query(x).split([self.qk_nope_head_dim, self.qk_rope_head_dim], -1)
        kv_latent, k_rope = self.wkv_a(x).split([self.kv_lora_rank, self.qk_rope_head_dim], -1)
        kv = self.wkv_b(self.kv_norm(kv_latent)).unflatten(
            -1, (-1, self.qk_nope_head_dim + self.v_head_dim)
        )
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k_rope = self.rope_key(k_rope).unsqueeze(2)  # (bs, seqlen, 1, rope): shared by the heads
        q_rope, k_rope = apply_rope(q_rope, k_rope, rope_cache)
        q = torch.cat([q_nope, q_rope], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        return self.wo(attend(q, k, v, mask, self.scale).flatten(2))

    def init_weights(self, out_std: float) -> None:
        names = ("wq_a", "wq") if self.q_lora_rank else ("wq",)
        for name in (*names, "wkv_a", "wkv_b"):
            trunc_normal(getattr(self, name).weight, INIT_STD)
        trunc_normal(self.wo.weight, out_std)
        self.kv_norm.reset_parameters()
        if self.q_lora_rank:
            self.q_norm.reset_parameters()


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: DeepSeekV3Args):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.is_moe = layer_id >= args.n_dense_layers
        if self.is_moe:
            self.moe = MoE(args.dim, args.moe)
        else:
            self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)
        # Std of the projections that write into the residual stream (wo, w2): scaled down so
        # the residual's variance does not grow with depth.
        depth = layer_id + 1 if args.depth_init else args.n_layers
        self.out_init_std = INIT_STD / math.sqrt(2 * depth)

    def forward(
        self, x: torch.Tensor, rope_cache: torch.Tensor, mask: AttentionMask = None
    ) -> torch.Tensor:
        # The mask by keyword: a TP plan lays out the positional inputs only.
        h = x + self.attention(self.attention_norm(x), rope_cache, mask=mask)
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


class DeepSeekV3Transformer(nn.Module):
    def __init__(self, args: DeepSeekV3Args):
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
        self.register_buffer("rope_cache", precompute_rope_cache(args), persistent=False)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        sequence_shard: SequenceShardLike | None = None,
    ) -> torch.Tensor:
        """tokens (bs, seqlen) int -> logits (bs, seqlen, vocab_size). In a pipeline stage
        without tok_embeddings the input is hidden states (bs, seqlen, dim), and without output
        (or with ``defer_head``) the model returns the hidden states. ``positions`` and
        ``sequence_shard``: as for Llama 3 (document masking, context parallelism)."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        h = in_autocast_dtype(h)
        rope, mask = rope_and_mask(self.args.attention, self.rope_cache, positions, sequence_shard)
        for layer in self.layers.values():
            h = layer(h, rope, mask=mask)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None and not self.defer_head else h

    def init_rope_cache(self, buffer_device: torch.device | None = None) -> None:
        """Recompute the (float32) RoPE cache, on buffer_device or where the buffer is: all a
        model needs besides its parameters, e.g. after `to_empty()` and before loading them."""
        with torch.device(buffer_device or self.rope_cache.device):
            self.rope_cache = precompute_rope_cache(self.args)

    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """Initialise every parameter and recompute the RoPE cache, e.g. after `to_empty()`:
        the embedding N(0, 1), the head N(0, 1/dim), projections as in Llama."""
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
