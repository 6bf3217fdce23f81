"""The DeepSeek flavors (a CPU debug size and the published DeepSeek-V2-Lite (16B),
DeepSeek-V2 (236B) and DeepSeek-V3 (671B) shapes) and the model shape a job config asks for."""

from __future__ import annotations

import dataclasses

from torchtitan.config import ConfigError, Model, suggest
from torchtitan.models.common.masks import attention_options
from torchtitan.models.common.moe import MoEArgs
from torchtitan.models.deepseek_v3.args import DeepSeekV3Args, YarnScaling

# The released configs' rope_scaling: 40x YaRN over a 4K pretraining context; V2's temperature
# (mscale, mscale_all_dim) is 0.707, V3's 1.0.
_V2_YARN = YarnScaling(mscale=0.707, mscale_all_dim=0.707)
_V3_YARN = YarnScaling(mscale=1.0, mscale_all_dim=1.0)

_16B = dict(
    vocab_size=102400,
    dim=2048,
    n_layers=27,
    n_dense_layers=1,
    n_heads=16,
    ffn_hidden_dim=10944,
    # V2 routing: softmax, the top 6 weights neither renormalised nor scaled.
    moe=MoEArgs(
        num_experts=64,
        top_k=6,
        hidden_dim=1408,
        num_shared_experts=2,
        score_func="softmax",
        normalize_scores=False,
    ),
    q_lora_rank=0,
    rope_scaling=_V2_YARN,
)

MODEL_FLAVORS: dict[str, DeepSeekV3Args] = {
    # Every feature at CPU size: low-rank query, YaRN, sigmoid group-limited routing, a shared
    # expert, one dense block.
    "debugmodel": DeepSeekV3Args(
        vocab_size=4096,
        dim=256,
        n_layers=4,
        n_dense_layers=1,
        n_heads=8,
        ffn_hidden_dim=768,
        moe=MoEArgs(
            num_experts=8,
            top_k=2,
            hidden_dim=128,
            num_shared_experts=1,
            score_func="sigmoid",
            normalize_scores=True,
            route_scale=2.5,
            num_groups=4,
            top_groups=2,
        ),
        q_lora_rank=64,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        rope_scaling=_V3_YARN,
    ),
    "16B": DeepSeekV3Args(**_16B),
    "16B-4L": DeepSeekV3Args(**{**_16B, "n_layers": 4}),  # benchmark: 16B's first 4 blocks
    "236B": DeepSeekV3Args(
        vocab_size=102400,
        dim=5120,
        n_layers=60,
        n_dense_layers=1,
        n_heads=128,
        ffn_hidden_dim=12288,
        moe=MoEArgs(
            num_experts=160,
            top_k=6,
            hidden_dim=1536,
            num_shared_experts=2,
            score_func="softmax",
            normalize_scores=False,
            route_scale=16.0,
            num_groups=8,
            top_groups=3,
        ),
        q_lora_rank=1536,
        rope_scaling=_V2_YARN,
    ),
    "671B": DeepSeekV3Args(
        vocab_size=129280,
        dim=7168,
        n_layers=61,
        n_dense_layers=3,
        n_heads=128,
        ffn_hidden_dim=18432,
        moe=MoEArgs(
            num_experts=256,
            top_k=8,
            hidden_dim=2048,
            num_shared_experts=1,
            score_func="sigmoid",
            normalize_scores=True,
            route_scale=2.5,
            num_groups=8,
            top_groups=4,
        ),
        q_lora_rank=1536,
        rope_scaling=_V3_YARN,
    ),
}


def get_model_args(flavor: str, **overrides) -> DeepSeekV3Args:
    """A validated copy of a named flavor, with some fields replaced."""
    if flavor not in MODEL_FLAVORS:
        raise ValueError(
            f"unknown model flavor '{flavor}' (choose one of: {', '.join(MODEL_FLAVORS)})"
            f"{suggest(flavor, MODEL_FLAVORS)}"
        )
    fields = [f.name for f in dataclasses.fields(DeepSeekV3Args)]
    for key in overrides:
        if key not in fields:
            raise ValueError(
                f"unknown model field '{key}' (valid fields: {', '.join(fields)})"
                f"{suggest(key, fields)}"
            )
    args = dataclasses.replace(MODEL_FLAVORS[flavor], **overrides)
    args.validate()
    return args


_NOT_DEEPSEEK = {
    "n_kv_heads": "multi-head latent attention has no key/value head count (every head has its "
    "own key and value, expanded from one latent)",
    "ffn_dim_multiplier": "it is a Llama 3 option; DeepSeek flavors set ffn_hidden_dim",
}


def model_args_from_config(model: Model, seq_len: int) -> DeepSeekV3Args:
    """The ``[model]`` section's DeepSeek-V3: its flavor with the shape and MoE overrides, the
    RoPE cache sized for ``seq_len``; validated (ConfigError, one line)."""
    overrides = model.shape_overrides()
    for key, why in _NOT_DEEPSEEK.items():
        if key in overrides:
            raise ConfigError(f"--model.{key} does not apply to deepseek_v3: {why}")
    try:
        attention = attention_options(model)
        args = get_model_args(model.flavor, max_seq_len=seq_len, attention=attention, **overrides)
        changes = model.moe_overrides()
        if changes:
            args = dataclasses.replace(args, moe=dataclasses.replace(args.moe, **changes))
            args.validate()
        return args
    except ValueError as e:
        changed = ", ".join(f"{k}={v}" for k, v in overrides.items())
        where = f" (flavor {model.flavor} with {changed})" if overrides else ""
        raise ConfigError(f"{e}{where}") from None
