"""The Qwen3 flavors (debug sizes and the published Qwen3 / Qwen3-MoE shapes) and the model shape
a job config asks for."""

from __future__ import annotations

import dataclasses

from torchtitan.config import ConfigError, Model, suggest
from torchtitan.models.common.masks import attention_options
from torchtitan.models.common.moe import MoEArgs
from torchtitan.models.qwen3.args import Qwen3Args

QWEN3_VOCAB_SIZE = 151936


def _qwen3_moe(hidden_dim: int) -> MoEArgs:
    """Qwen3-MoE routing: softmax over 128 experts, top 8, renormalised (norm_topk_prob), no
    shared expert. Trained here with aux-loss-free balancing (a selection-only expert bias);
    Hugging Face's inference routing is the same with that bias at zero."""
    return MoEArgs(
        num_experts=128,
        top_k=8,
        hidden_dim=hidden_dim,
        score_func="softmax",
        normalize_scores=True,
        balance_bias=True,
        aux_loss_coeff=0.0,
    )


def _published(**shape) -> Qwen3Args:
    """A published Qwen3 shape: what every Qwen3 checkpoint shares, plus ``shape``."""
    common = dict(vocab_size=QWEN3_VOCAB_SIZE, head_dim=128, norm_eps=1e-6, rope_theta=1e6)
    return Qwen3Args(**common, **shape)


_DEBUG = dict(dim=256, n_layers=6, n_heads=16, n_kv_heads=4, head_dim=32, vocab_size=4096)
_30B_A3B = dict(
    dim=2048,
    n_layers=48,
    n_heads=32,
    n_kv_heads=4,
    ffn_hidden_dim=6144,
    tie_embeddings=False,
    moe=_qwen3_moe(768),
)

MODEL_FLAVORS: dict[str, Qwen3Args] = {
    # n_heads * head_dim (512) != dim (256), as in the published shapes.
    "debugmodel": Qwen3Args(**_DEBUG, ffn_hidden_dim=768, tie_embeddings=False),
    "debugmodel_tied": Qwen3Args(**_DEBUG, ffn_hidden_dim=768, tie_embeddings=True),
    "debugmodel_moe": Qwen3Args(
        **_DEBUG,
        ffn_hidden_dim=768,
        tie_embeddings=False,
        moe=MoEArgs(num_experts=8, top_k=2, hidden_dim=128, balance_bias=True),
    ),
    # Dense Qwen3 (Hugging Face Qwen/Qwen3-*): the three smallest tie their embeddings.
    "0.6B": _published(
        dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, ffn_hidden_dim=3072, tie_embeddings=True
    ),
    "1.7B": _published(
        dim=2048, n_layers=28, n_heads=16, n_kv_heads=8, ffn_hidden_dim=6144, tie_embeddings=True
    ),
    "4B": _published(
        dim=2560, n_layers=36, n_heads=32, n_kv_heads=8, ffn_hidden_dim=9728, tie_embeddings=True
    ),
    "8B": _published(
        dim=4096, n_layers=36, n_heads=32, n_kv_heads=8, ffn_hidden_dim=12288, tie_embeddings=False
    ),
    "14B": _published(
        dim=5120, n_layers=40, n_heads=40, n_kv_heads=8, ffn_hidden_dim=17408, tie_embeddings=False
    ),
    "32B": _published(
        dim=5120, n_layers=64, n_heads=64, n_kv_heads=8, ffn_hidden_dim=25600, tie_embeddings=False
    ),
    # Qwen3-MoE: every block routes 8 of 128 experts.
    "30B-A3B": _published(**_30B_A3B),
    "30B-A3B-4L": _published(**{**_30B_A3B, "n_layers": 4}),  # benchmark: 4 of the 48 blocks
    "235B-A22B": _published(
        dim=4096,
        n_layers=94,
        n_heads=64,
        n_kv_heads=4,
        ffn_hidden_dim=12288,
        tie_embeddings=False,
        moe=_qwen3_moe(1536),
    ),
}


def get_model_args(flavor: str, **overrides) -> Qwen3Args:
    """A validated copy of a named flavor, with some fields replaced."""
    if flavor not in MODEL_FLAVORS:
        raise ValueError(
            f"unknown model flavor '{flavor}' (choose one of: {', '.join(MODEL_FLAVORS)})"
            f"{suggest(flavor, MODEL_FLAVORS)}"
        )
    fields = [f.name for f in dataclasses.fields(Qwen3Args)]
    for key in overrides:
        if key not in fields:
            raise ValueError(
                f"unknown model field '{key}' (valid fields: {', '.join(fields)})"
                f"{suggest(key, fields)}"
            )
    args = dataclasses.replace(MODEL_FLAVORS[flavor], **overrides)
    args.validate()
    return args


def model_args_from_config(model: Model, seq_len: int) -> Qwen3Args:
    """The ``[model]`` section's Qwen3: its flavor with the shape overrides, the RoPE cache sized
    for ``seq_len`` (``training.seq_len``); validated (ConfigError, one line)."""
    overrides = model.shape_overrides()
    if "ffn_dim_multiplier" in overrides:
        raise ConfigError(
            "--model.ffn_dim_multiplier is a Llama 3 option; Qwen3 flavors set ffn_hidden_dim"
        )
    try:
        attention = attention_options(model)
        args = get_model_args(model.flavor, max_seq_len=seq_len, attention=attention, **overrides)
        return _with_moe_options(args, model)
    except ValueError as e:
        changed = ", ".join(f"{k}={v}" for k, v in overrides.items())
        where = f" (flavor {model.flavor} with {changed})" if overrides else ""
        raise ConfigError(f"{e}{where}") from None


def _with_moe_options(args: Qwen3Args, model: Model) -> Qwen3Args:
    """``args`` with the ``--model.moe_*`` options applied (ValueError on a dense flavor)."""
    changes = model.moe_overrides()
    if not changes:
        return args
    if args.moe is None:
        names = ", ".join(f"--model.moe_{k}" for k in changes)
        raise ValueError(f"{names}: flavor {model.flavor} is dense (no MoE layers)")
    args = dataclasses.replace(args, moe=dataclasses.replace(args.moe, **changes))
    args.validate()
    return args
