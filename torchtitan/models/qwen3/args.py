"""Qwen3 model hyperparameters: the shape of a dense or mixture-of-experts Qwen3 and what it
costs (parameters, training FLOPs per token)."""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.models.common.masks import AttentionOptions
from torchtitan.models.common.moe import MoEArgs


@dataclass(kw_only=True)
class Qwen3Args:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None  # None means n_heads (plain multi-head attention)
    # Explicit, not dim // n_heads: Qwen3 0.6B has dim 1024 but 16 heads of 128.
    head_dim: int
    vocab_size: int
    # SwiGLU hidden size of a dense block. With ``moe`` set every block is MoE and this is only
    # carried for Hugging Face's config (its ``intermediate_size``).
    ffn_hidden_dim: int
    norm_eps: float = 1e-6
    rope_theta: float = 1e6
    max_seq_len: int = 2048  # length of the precomputed RoPE cache
    tie_embeddings: bool  # the output head shares the token embedding table
    moe: MoEArgs | None = None  # every block MoE (Qwen3-MoE's decoder_sparse_step 1)
    depth_init: bool = True  # scale output-projection init by layer depth rather than n_layers
    attention: AttentionOptions = AttentionOptions()  # kernel, mask, per-document RoPE

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads with the None default resolved."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    def attention_params(self) -> int:
        """wq, wo, wk, wv and the per-head q/k RMSNorm weights."""
        d, hd = self.dim, self.head_dim
        return 2 * d * self.n_heads * hd + 2 * d * self.kv_heads * hd + 2 * hd

    def _ffn_params(self) -> tuple[int, int]:
        """(total, active per token) parameters of one block's FFN."""
        if self.moe is None:
            dense = 3 * self.dim * self.ffn_hidden_dim
            return dense, dense
        return self.moe.params(self.dim)

    def block_params(self) -> int:
        """Parameters of one transformer block (for a MoE block: every expert)."""
        return self.attention_params() + self._ffn_params()[0] + 2 * self.dim

    def block_active_params(self) -> int:
        """Parameters of one block that a token passes through (routed experts only)."""
        return self.attention_params() + self._ffn_params()[1] + 2 * self.dim

    def _outside_blocks(self, include_embedding: bool) -> int:
        """Final norm and head, plus the embedding table when asked for and not tied.

        The head is a matmul, so it is never "embedding"; a tied table is the head's weight and
        is counted once, as the head.
        """
        n = self.dim + self.dim * self.vocab_size
        if include_embedding and not self.tie_embeddings:
            n += self.vocab_size * self.dim
        return n

    def num_params(self, include_embedding: bool = True) -> int:
        """Exact parameter count of ``Qwen3Transformer(self)``, tied weights counted once.

        The "embedding" is the token embedding table only (a lookup, no FLOPs); with tied
        embeddings it is the head's weight, so both counts include it once.
        """
        return self.n_layers * self.block_params() + self._outside_blocks(include_embedding)

    def active_params(self, include_embedding: bool = False) -> int:
        """Parameters a token passes through: ``num_params`` with only the routed experts."""
        return self.n_layers * self.block_active_params() + self._outside_blocks(include_embedding)

    def block_flops_per_token(self, seq_len: int) -> int:
        """One block's training FLOPs per token as computed: 6x its active parameters for the
        matmuls plus causal attention (half the 12 * heads * head_dim * seq of
        ``flops_per_token``'s convention, which counts the masked half too)."""
        return 6 * self.block_active_params() + 6 * self.n_heads * self.head_dim * seq_len

    def head_flops_per_token(self) -> int:
        """The output head's training FLOPs per token (tied or not; the embedding is a lookup)."""
        return 6 * self.dim * self.vocab_size

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs (forward + backward) per token: 6N over the active non-embedding
        parameters (the head included) plus attention."""
        attn = 12 * self.n_layers * self.n_heads * self.head_dim * seq_len
        return 6 * self.active_params(include_embedding=False) + attn

    def validate(self) -> None:
        self.attention.validate()
        sizes = ("dim", "n_layers", "n_heads", "head_dim", "vocab_size", "ffn_hidden_dim")
        for name in (*sizes, "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.kv_heads <= 0:
            raise ValueError(f"model.n_kv_heads must be positive, got {self.n_kv_heads}")
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"model.n_heads ({self.n_heads}) must be divisible by "
                f"model.n_kv_heads ({self.kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"model.head_dim must be even for RoPE, got {self.head_dim}")
        if self.norm_eps <= 0:
            raise ValueError(f"model.norm_eps must be positive, got {self.norm_eps}")
        if self.rope_theta <= 0:
            raise ValueError(f"model.rope_theta must be positive, got {self.rope_theta}")
        if self.moe is not None:
            self.moe.validate()
