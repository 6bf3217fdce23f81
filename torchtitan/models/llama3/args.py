"""Llama 3 model hyperparameters and the published model shapes."""

import dataclasses
from dataclasses import dataclass

from torchtitan.config import ConfigError, Model, suggest
from torchtitan.models.common.masks import AttentionOptions, attention_options


@dataclass(kw_only=True)
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None  # None means n_heads (plain multi-head attention)
    vocab_size: int
    multiple_of: int = 256  # the SwiGLU hidden size is rounded up to a multiple of this
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: bool = False  # Llama 3.1 low-frequency RoPE scaling
    rope_scaling_factor: float = 8.0  # 8 for Llama 3.1, 32 for Llama 3.2 1B/3B
    max_seq_len: int = 2048  # length of the precomputed RoPE cache
    depth_init: bool = True  # scale output-projection init by layer depth rather than n_layers
    attention: AttentionOptions = AttentionOptions()  # kernel, mask, per-document RoPE

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads with the None default resolved."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def ffn_hidden_dim(self) -> int:
        # SwiGLU has three matrices instead of two, so 2/3 of 4*dim keeps the FLOPs of a plain MLP.
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def num_params(self, include_embedding: bool = True) -> int:
        """Exact parameter count of `Transformer(self)`.

        The "embedding" is the token embedding table only: it is a lookup and costs no FLOPs.
        The output head is a real matmul, so it counts as a non-embedding parameter. Input and
        output weights are never tied, so e.g. "1B" has ~1.50B parameters, not the published
        1.24B (Llama 3.2 ties them).
        """
        d = self.dim
        n = self.n_layers * self.block_params() + d + d * self.vocab_size  # final norm + head
        if include_embedding:
            n += self.vocab_size * d
        return n

    def block_params(self) -> int:
        """Parameters of one transformer block."""
        d, hd = self.dim, self.head_dim
        attn = d * self.n_heads * hd * 2 + d * self.kv_heads * hd * 2  # wq, wo + wk, wv
        ffn = 3 * d * self.ffn_hidden_dim
        return attn + ffn + 2 * d  # two RMSNorm weights

    def block_flops_per_token(self, seq_len: int) -> int:
        """One block's training FLOPs per token as computed: 6x its parameters for the matmuls
        plus causal attention (half the 12 * heads * head_dim * seq of ``flops_per_token``'s
        convention, which counts the masked half too)."""
        return 6 * self.block_params() + 6 * self.n_heads * self.head_dim * seq_len

    def head_flops_per_token(self) -> int:
        """The output head's training FLOPs per token (the embedding is a lookup: none)."""
        return 6 * self.dim * self.vocab_size

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs (forward + backward) per token: 6N for the matmuls plus attention."""
        attn = 12 * self.n_layers * self.n_heads * self.head_dim * seq_len
        return 6 * self.num_params(include_embedding=False) + attn

    def validate(self) -> None:
        self.attention.validate()
        sizes = ("dim", "n_layers", "n_heads", "vocab_size", "multiple_of", "max_seq_len")
        for name in sizes:
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.kv_heads <= 0:
            raise ValueError(f"model.n_kv_heads must be positive, got {self.n_kv_heads}")
        if self.dim % self.n_heads:
            raise ValueError(
                f"model.dim ({self.dim}) must be divisible by model.n_heads ({self.n_heads})"
            )
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"model.n_heads ({self.n_heads}) must be divisible by "
                f"model.n_kv_heads ({self.kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"head_dim = dim / n_heads = {self.head_dim} must be even for RoPE; "
                "change model.dim or model.n_heads"
            )
        if self.ffn_dim_multiplier is not None and self.ffn_dim_multiplier <= 0:
            raise ValueError(
                f"model.ffn_dim_multiplier must be positive, got {self.ffn_dim_multiplier}"
            )
        if self.rope_scaling and self.rope_scaling_factor < 1:
            raise ValueError(
                f"model.rope_scaling_factor must be >= 1, got {self.rope_scaling_factor}"
            )


MODEL_FLAVORS: dict[str, ModelArgs] = {
    "debugmodel": ModelArgs(dim=256, n_layers=6, n_heads=16, n_kv_heads=4, vocab_size=4096),
    # Llama 3.2 1B / 3B
    "1B": ModelArgs(
        vocab_size=128256,
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim_multiplier=1.5,
        multiple_of=256,
        rope_scaling=True,
        rope_scaling_factor=32.0,
    ),
    "3B": ModelArgs(
        vocab_size=128256,
        dim=3072,
        n_layers=28,
        n_heads=24,
        n_kv_heads=8,
        ffn_dim_multiplier=1.0,
        multiple_of=256,
        rope_scaling=True,
        rope_scaling_factor=32.0,
    ),
    # Llama 3.1 8B / 70B / 405B
    "8B": ModelArgs(
        vocab_size=128256,
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim_multiplier=1.3,
        multiple_of=1024,
        rope_scaling=True,
    ),
    "70B": ModelArgs(
        vocab_size=128256,
        dim=8192,
        n_layers=80,
        n_heads=64,
        n_kv_heads=8,
        ffn_dim_multiplier=1.3,
        multiple_of=4096,
        rope_scaling=True,
    ),
    "405B": ModelArgs(
        vocab_size=128256,
        dim=16384,
        n_layers=126,
        n_heads=128,
        n_kv_heads=8,
        ffn_dim_multiplier=1.2,
        multiple_of=4096,
        rope_scaling=True,
    ),
}


def get_model_args(flavor: str, **overrides) -> ModelArgs:
    """A validated copy of a named flavor, with some fields replaced."""
    if flavor not in MODEL_FLAVORS:
        raise ValueError(
            f"unknown model flavor '{flavor}' (choose one of: {', '.join(MODEL_FLAVORS)})"
            f"{suggest(flavor, MODEL_FLAVORS)}"
        )
    fields = [f.name for f in dataclasses.fields(ModelArgs)]
    for key in overrides:
        if key not in fields:
            raise ValueError(
                f"unknown model field '{key}' (valid fields: {', '.join(fields)})"
                f"{suggest(key, fields)}"
            )
    args = dataclasses.replace(MODEL_FLAVORS[flavor], **overrides)
    args.validate()
    return args


def model_args_from_config(model: Model, seq_len: int) -> ModelArgs:
    """The ``[model]`` section's model: its flavor with the shape overrides, the RoPE cache sized
    for ``seq_len`` (``training.seq_len``); validated (ConfigError, one line). Preflight, the
    trainer and the planner all build the model's shape here."""
    overrides = model.shape_overrides()
    if model.moe_overrides():
        raise ConfigError(
            "--model.moe_* options apply to MoE flavors; llama3 has none (see --model.name qwen3)"
        )
    try:
        attention = attention_options(model)
        return get_model_args(model.flavor, max_seq_len=seq_len, attention=attention, **overrides)
    except ValueError as e:
        changed = ", ".join(f"{k}={v}" for k, v in overrides.items())
        where = f" (flavor {model.flavor} with {changed})" if overrides else ""
        raise ConfigError(f"{e}{where}") from None
