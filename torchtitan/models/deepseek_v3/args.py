"""DeepSeek-V3 model hyperparameters: multi-head latent attention, the dense first blocks and
the MoE blocks with shared experts, and what the model costs (parameters, training FLOPs)."""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.models.common.masks import AttentionOptions
from torchtitan.models.common.moe import MoEArgs


@dataclass(frozen=True)
class YarnScaling:
    """YaRN's RoPE frequency scaling as the DeepSeek configs set it (their ``rope_scaling``)."""

    factor: float = 40.0
    original_max_seq_len: int = 4096  # the context the frequencies were first trained for
    beta_fast: float = 32.0  # rotations above which a frequency is kept as it is
    beta_slow: float = 1.0  # rotations below which a frequency is divided by ``factor``
    # Attention temperature: ``mscale`` scales the rotated part of q and k (relative to
    # ``mscale_all_dim``), ``mscale_all_dim`` the softmax scale of the whole head; 0 = unset.
    mscale: float = 1.0
    mscale_all_dim: float = 1.0

    def validate(self) -> None:
        if self.factor < 1:
            raise ValueError(f"rope scaling factor must be >= 1, got {self.factor}")
        if self.original_max_seq_len <= 0 or self.beta_fast <= 0 or self.beta_slow <= 0:
            raise ValueError("rope scaling original_max_seq_len, beta_fast, beta_slow must be > 0")


@dataclass(kw_only=True)
class DeepSeekV3Args:
    dim: int
    n_layers: int
    n_heads: int
    vocab_size: int
    ffn_hidden_dim: int  # SwiGLU hidden size of the dense blocks
    n_dense_layers: int = 1  # the first blocks are dense, the rest MoE
    moe: MoEArgs
    # Multi-head latent attention: queries through an optional low-rank bottleneck (0 = a full
    # projection), keys and values from one shared latent of kv_lora_rank, and a RoPE part of
    # qk_rope_head_dim per head whose key is shared by all heads.
    q_lora_rank: int = 0
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: YarnScaling | None = None
    max_seq_len: int = 2048  # length of the precomputed RoPE cache
    depth_init: bool = True  # scale output-projection init by layer depth rather than n_layers
    attention: AttentionOptions = AttentionOptions()  # kernel, mask, per-document RoPE

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_heads(self) -> int:
        """Every head has its own key and value once the latent is expanded."""
        return self.n_heads

    @property
    def tie_embeddings(self) -> bool:
        return False

    def attention_linears(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each attention projection, by module name."""
        d, h = self.dim, self.n_heads
        q_out = h * self.qk_head_dim
        # wq makes the heads' queries, from x or (low-rank) from the latent wq_a makes.
        if self.q_lora_rank:
            query = {"wq_a": (d, self.q_lora_rank), "wq": (self.q_lora_rank, q_out)}
        else:
            query = {"wq": (d, q_out)}
        kv_b_out = h * (self.qk_nope_head_dim + self.v_head_dim)
        return {
            **query,
            "wkv_a": (d, self.kv_lora_rank + self.qk_rope_head_dim),
            "wkv_b": (self.kv_lora_rank, kv_b_out),
            "wo": (h * self.v_head_dim, d),
        }

    def attention_params(self) -> int:
        """The projections and the latent RMSNorm weights."""
        linears = sum(k * n for k, n in self.attention_linears().values())
        return linears + self.kv_lora_rank + self.q_lora_rank

    def _ffn_params(self, moe_block: bool) -> tuple[int, int]:
        """(total, active per token) parameters of one block's feed-forward."""
        if moe_block:
            return self.moe.params(self.dim)
        dense = 3 * self.dim * self.ffn_hidden_dim
        return dense, dense

    def _blocks_params(self, active: bool) -> int:
        n_moe = self.n_layers - self.n_dense_layers
        per_block = self.attention_params() + 2 * self.dim
        dense = self._ffn_params(False)[active]
        return (
            self.n_layers * per_block
            + self.n_dense_layers * dense
            + n_moe * (self._ffn_params(True)[active])
        )

    def num_params(self, include_embedding: bool = True) -> int:
        """Exact parameter count of ``DeepSeekV3Transformer(self)``."""
        outside = self.dim + self.dim * self.vocab_size * (2 if include_embedding else 1)
        return self._blocks_params(active=False) + outside

    def active_params(self, include_embedding: bool = False) -> int:
        """Parameters a token passes through: ``num_params`` with only the routed top-k."""
        outside = self.dim + self.dim * self.vocab_size * (2 if include_embedding else 1)
        return self._blocks_params(active=True) + outside

    def attention_flops_per_token(self, seq_len: int) -> int:
        """Causal attention's training FLOPs per token per block (q.k over qk_head_dim, p.v over
        v_head_dim, the masked half not counted)."""
        return 3 * self.n_heads * (self.qk_head_dim + self.v_head_dim) * seq_len

    def block_flops_per_token(self, seq_len: int) -> int:
        """A MoE block's training FLOPs per token (the most expensive kind; PP balances on it)."""
        active = self.attention_params() + 2 * self.dim + self._ffn_params(True)[1]
        return 6 * active + self.attention_flops_per_token(seq_len)

    def head_flops_per_token(self) -> int:
        return 6 * self.dim * self.vocab_size

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token: 6N over the active non-embedding parameters plus attention
        (counted with its masked half, as the Llama and Qwen3 formulas do)."""
        attention = 2 * self.n_layers * self.attention_flops_per_token(seq_len)
        return 6 * self.active_params(include_embedding=False) + attention

    def validate(self) -> None:
        self.attention.validate()
        sizes = ("dim", "n_layers", "n_heads", "vocab_size", "ffn_hidden_dim", "max_seq_len")
        for name in (*sizes, "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.q_lora_rank < 0:
            raise ValueError(f"model.q_lora_rank must be >= 0, got {self.q_lora_rank}")
        if not 0 <= self.n_dense_layers <= self.n_layers:
            raise ValueError(
                f"model.n_dense_layers {self.n_dense_layers} must be in [0, n_layers "
                f"{self.n_layers}]"
            )
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"model.qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        if self.norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError("model.norm_eps and model.rope_theta must be positive")
        if self.rope_scaling is not None:
            self.rope_scaling.validate()
        self.moe.validate()
