"""config.json (``DeepseekV3Config``) <-> ``DeepSeekV3Args``.

Hugging Face's DeepSeek-V3 routes by sigmoid scores with the selection bias
(``e_score_correction_bias``), group-limited, and always multiplies by
``routed_scaling_factor``: our flavors that route by softmax (16B, 236B: DeepSeek-V2's way)
have no equivalent there and are refused on export. ``max_position_embeddings`` is metadata
(our RoPE cache length is ``max_seq_len``); YaRN is read from ``rope_scaling`` (4.x, the
published configs) or ``rope_parameters`` (5.x) and written as both.
"""

from __future__ import annotations

import dataclasses

from torchtitan.models.common.moe import MoEArgs
from torchtitan.models.deepseek_v3.args import DeepSeekV3Args, YarnScaling
from torchtitan.models.deepseek_v3.flavors import MODEL_FLAVORS
from torchtitan.models.llama3.hf.config import llama3_bos_eos

# <｜begin▁of▁sentence｜> and <｜end▁of▁sentence｜> of DeepSeek-V3's 129,280-entry vocabulary.
DEEPSEEK_V3_BOS_EOS = (0, 1)
_V3_VOCAB_SIZE = 129280


def _rope_fields(args: DeepSeekV3Args) -> dict:
    yarn = args.rope_scaling
    if yarn is None:
        return {"rope_scaling": None, "rope_parameters": {"rope_type": "default"}}
    scaling = {
        "rope_type": "yarn",
        "factor": yarn.factor,
        "original_max_position_embeddings": yarn.original_max_seq_len,
        "beta_fast": yarn.beta_fast,
        "beta_slow": yarn.beta_slow,
        "mscale": yarn.mscale,
        "mscale_all_dim": yarn.mscale_all_dim,
    }
    return {"rope_scaling": scaling, "rope_parameters": dict(scaling)}


def _moe_fields(moe: MoEArgs) -> dict:
    if moe.score_func != "sigmoid":
        raise ValueError(
            "Hugging Face's DeepSeek-V3 routes by sigmoid scores; this flavor routes by "
            f"{moe.score_func} (DeepSeek-V2's routing) and has no DeepseekV3Config equivalent"
        )
    return {
        "n_routed_experts": moe.num_experts,
        "n_shared_experts": moe.num_shared_experts,
        "num_experts_per_tok": moe.top_k,
        "moe_intermediate_size": moe.hidden_dim,
        "n_group": moe.num_groups,
        "topk_group": moe.top_groups,
        "norm_topk_prob": moe.normalize_scores,
        "routed_scaling_factor": moe.route_scale,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
    }


def hf_config_dict(
    args: DeepSeekV3Args,
    *,
    dtype: str = "float32",
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    max_position_embeddings: int | None = None,
) -> dict:
    """config.json describing ``DeepSeekV3Transformer(args)`` (ValueError for softmax routing)."""
    bos, eos = DEEPSEEK_V3_BOS_EOS if args.vocab_size == _V3_VOCAB_SIZE else (None, None)
    if bos is None:
        bos, eos = llama3_bos_eos(args.vocab_size)
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_hidden_dim,
        "num_hidden_layers": args.n_layers,
        "first_k_dense_replace": args.n_dense_layers,
        "moe_layer_freq": 1,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_heads,
        "q_lora_rank": args.q_lora_rank or None,
        "kv_lora_rank": args.kv_lora_rank,
        "qk_nope_head_dim": args.qk_nope_head_dim,
        "qk_rope_head_dim": args.qk_rope_head_dim,
        "v_head_dim": args.v_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings or args.max_seq_len,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        **_rope_fields(args),
        "rope_interleave": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": bos if bos_token_id is None else bos_token_id,
        "eos_token_id": eos if eos_token_id is None else eos_token_id,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    cfg["rope_parameters"]["rope_theta"] = args.rope_theta
    return cfg | _moe_fields(args.moe)


def _require(cfg: dict, key: str):
    if cfg.get(key) is None:
        raise ValueError(f"HF config lacks '{key}'")
    return cfg[key]


def _rope(cfg: dict) -> tuple[float, YarnScaling | None]:
    """(rope_theta, YaRN or None) of a 4.x or 5.x config; ValueError for other scalings."""
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta")) or 10000.0)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "yarn":
        raise ValueError(f"HF rope_type '{rope_type}' is not supported (only 'default', 'yarn')")
    yarn = YarnScaling(
        factor=float(_require(params, "factor")),
        original_max_seq_len=int(_require(params, "original_max_position_embeddings")),
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        mscale=float(params.get("mscale") or 0),
        mscale_all_dim=float(params.get("mscale_all_dim") or 0),
    )
    return theta, yarn


def _check_supported(cfg: dict) -> None:
    model_type = cfg.get("model_type", "deepseek_v3")
    if model_type != "deepseek_v3":
        raise ValueError(f"HF config model_type is '{model_type}', expected 'deepseek_v3'")
    fixed = {"hidden_act": "silu", "attention_bias": False, "moe_layer_freq": 1}
    fixed |= {"scoring_func": "sigmoid", "rope_interleave": True}
    for key, ours in fixed.items():
        if cfg.get(key, ours) != ours:
            raise ValueError(f"HF config has {key}={cfg[key]!r}; this model supports only {ours!r}")


def _moe_args(cfg: dict) -> MoEArgs:
    return MoEArgs(
        num_experts=cfg.get("n_routed_experts") or _require(cfg, "num_local_experts"),
        top_k=_require(cfg, "num_experts_per_tok"),
        hidden_dim=_require(cfg, "moe_intermediate_size"),
        num_shared_experts=cfg.get("n_shared_experts") or 0,
        score_func="sigmoid",
        normalize_scores=bool(cfg.get("norm_topk_prob", True)),
        route_scale=float(cfg.get("routed_scaling_factor", 2.5)),
        num_groups=cfg.get("n_group") or 1,
        top_groups=cfg.get("topk_group") or 1,
        balance_bias=True,
    )


def model_args_from_hf_config(cfg: dict, max_seq_len: int | None = None) -> DeepSeekV3Args:
    """DeepSeekV3Args with exactly the shapes and function of an HF DeepSeek-V3 config (a dict).
    ``max_seq_len`` (our RoPE cache length) defaults to ``max_position_embeddings``."""
    _check_supported(cfg)
    theta, yarn = _rope(cfg)
    args = DeepSeekV3Args(
        dim=_require(cfg, "hidden_size"),
        n_layers=_require(cfg, "num_hidden_layers"),
        n_dense_layers=cfg.get("first_k_dense_replace", 3),
        n_heads=_require(cfg, "num_attention_heads"),
        vocab_size=_require(cfg, "vocab_size"),
        ffn_hidden_dim=_require(cfg, "intermediate_size"),
        moe=_moe_args(cfg),
        q_lora_rank=cfg.get("q_lora_rank") or 0,
        kv_lora_rank=_require(cfg, "kv_lora_rank"),
        qk_nope_head_dim=_require(cfg, "qk_nope_head_dim"),
        qk_rope_head_dim=_require(cfg, "qk_rope_head_dim"),
        v_head_dim=_require(cfg, "v_head_dim"),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=yarn,
        max_seq_len=max_seq_len or cfg.get("max_position_embeddings") or 4096,
    )
    args.validate()
    return args


def _signature(args: DeepSeekV3Args) -> dict:
    """Everything that decides the weights' shapes and the function they compute."""
    sig = dataclasses.asdict(args)
    for key in ("max_seq_len", "depth_init"):
        sig.pop(key)
    for key in ("balance_bias", "bias_update_rate", "aux_loss_coeff"):  # training only
        sig["moe"].pop(key)
    return sig


def check_compatible(
    hf_args: DeepSeekV3Args, args: DeepSeekV3Args, what: str = "the model"
) -> None:
    """One-line ValueError unless the two describe the same shapes and function."""
    a, b = _flat(_signature(hf_args)), _flat(_signature(args))
    diffs = [
        f"{k} {a.get(k)} vs {b.get(k)}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)
    ]
    if diffs:
        raise ValueError(f"HF config does not match {what} (HF vs ours): {'; '.join(diffs)}")


def _flat(sig: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in sig.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def matching_flavors(args: DeepSeekV3Args) -> list[str]:
    """Our flavors with exactly ``args``' shapes and function (max_seq_len aside)."""
    sig = _signature(args)
    return [name for name, flavor in MODEL_FLAVORS.items() if _signature(flavor) == sig]
