"""config.json (``Qwen3Config`` / ``Qwen3MoeConfig``) <-> ``Qwen3Args``.

Only what changes the function is converted; ``max_position_embeddings`` is metadata (our RoPE
cache length is ``max_seq_len``). Imported MoE models get our training routing defaults
(aux-loss-free balancing with a zero bias, no auxiliary loss): the same function as HF's.
"""

from __future__ import annotations

import dataclasses

from torchtitan.models.common.moe import MoEArgs
from torchtitan.models.llama3.hf.config import llama3_bos_eos
from torchtitan.models.qwen3.args import Qwen3Args
from torchtitan.models.qwen3.flavors import MODEL_FLAVORS, QWEN3_VOCAB_SIZE

# <|endoftext|> and <|im_end|>: bos/eos of the published (post-trained) Qwen3 configs.
QWEN3_BOS_EOS = (151643, 151645)


def _default_bos_eos(vocab_size: int) -> tuple[int | None, int | None]:
    """Qwen's ids for Qwen's vocabulary, else the Llama 3 layout of the bundled tokenizer."""
    return QWEN3_BOS_EOS if vocab_size == QWEN3_VOCAB_SIZE else llama3_bos_eos(vocab_size)


def _moe_fields(moe: MoEArgs) -> dict:
    """The Qwen3MoeConfig fields of our MoE settings (ValueError where HF has no equivalent)."""
    if moe.num_shared_experts or moe.score_func != "softmax" or moe.route_scale != 1.0:
        raise ValueError(
            "Hugging Face's Qwen3-MoE routes by softmax with route_scale 1 and no shared experts; "
            f"got score_func={moe.score_func}, route_scale={moe.route_scale}, "
            f"num_shared_experts={moe.num_shared_experts}"
        )
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.top_k,
        "moe_intermediate_size": moe.hidden_dim,
        "norm_topk_prob": moe.normalize_scores,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "router_aux_loss_coef": moe.aux_loss_coeff,
        "output_router_logits": False,
    }


def hf_config_dict(
    args: Qwen3Args,
    *,
    dtype: str = "float32",
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    max_position_embeddings: int | None = None,
) -> dict:
    """config.json describing ``Qwen3Transformer(args)``: a ``Qwen3Config``, or a
    ``Qwen3MoeConfig`` when ``args.moe`` is set. RoPE is written both as ``rope_theta`` (4.x)
    and as ``rope_parameters`` (5.x)."""
    bos, eos = _default_bos_eos(args.vocab_size)
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_hidden_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings or args.max_seq_len,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": args.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "tie_word_embeddings": args.tie_embeddings,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": bos if bos_token_id is None else bos_token_id,
        "eos_token_id": eos if eos_token_id is None else eos_token_id,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    return cfg | (_moe_fields(args.moe) if args.moe is not None else {})


def _require(cfg: dict, key: str):
    if cfg.get(key) is None:
        raise ValueError(f"HF config lacks '{key}'")
    return cfg[key]


def _rope_theta(cfg: dict) -> float:
    """rope_theta of a 4.x or 5.x config; ValueError for any RoPE scaling (Qwen3 has none)."""
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"HF rope_type '{rope_type}' is not supported (only 'default')")
    theta = params.get("rope_theta", cfg.get("rope_theta"))
    return float(10000.0 if theta is None else theta)  # HF's default base


def _check_supported(cfg: dict) -> None:
    model_type = cfg.get("model_type", "qwen3")
    if model_type not in ("qwen3", "qwen3_moe"):
        raise ValueError(f"HF config model_type is '{model_type}', expected 'qwen3' or 'qwen3_moe'")
    fixed = {"hidden_act": "silu", "attention_bias": False, "use_sliding_window": False}
    if model_type == "qwen3_moe":
        fixed |= {"decoder_sparse_step": 1, "mlp_only_layers": []}
    for key, ours in fixed.items():
        if cfg.get(key, ours) != ours:
            raise ValueError(f"HF config has {key}={cfg[key]!r}; this model supports only {ours!r}")


def _moe_args(cfg: dict) -> MoEArgs | None:
    if cfg.get("model_type") != "qwen3_moe":
        return None
    return MoEArgs(
        # transformers 5 writes num_experts as num_local_experts (its attribute_map)
        num_experts=cfg.get("num_experts") or _require(cfg, "num_local_experts"),
        top_k=_require(cfg, "num_experts_per_tok"),
        hidden_dim=_require(cfg, "moe_intermediate_size"),
        score_func="softmax",
        normalize_scores=bool(cfg.get("norm_topk_prob", False)),  # Qwen3MoeConfig's default
        balance_bias=True,
        aux_loss_coeff=0.0,
    )


def model_args_from_hf_config(cfg: dict, max_seq_len: int | None = None) -> Qwen3Args:
    """Qwen3Args with exactly the shapes and function of an HF Qwen3 / Qwen3-MoE config (as a
    dict). ``max_seq_len`` (our RoPE cache length) defaults to ``max_position_embeddings``."""
    _check_supported(cfg)
    dim, n_heads = _require(cfg, "hidden_size"), _require(cfg, "num_attention_heads")
    args = Qwen3Args(
        dim=dim,
        n_layers=_require(cfg, "num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        head_dim=cfg.get("head_dim") or dim // n_heads,
        vocab_size=_require(cfg, "vocab_size"),
        ffn_hidden_dim=_require(cfg, "intermediate_size"),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg),
        max_seq_len=max_seq_len or cfg.get("max_position_embeddings") or 2048,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        moe=_moe_args(cfg),
    )
    args.validate()
    return args


def _signature(args: Qwen3Args) -> dict:
    """Everything that decides the weights' shapes and the function they compute."""
    sig = dataclasses.asdict(args)
    sig["n_kv_heads"] = args.kv_heads
    for key in ("max_seq_len", "depth_init"):
        sig.pop(key)
    if args.moe is not None:
        sig.pop("ffn_hidden_dim")  # a MoE model has no dense FFN: HF metadata only
        sig["moe"] = {k: sig["moe"][k] for k in ("num_experts", "top_k", "hidden_dim")} | {
            "normalize_scores": args.moe.normalize_scores
        }
    return sig


def _kind(args: Qwen3Args) -> str:
    return "a dense Qwen3 model" if args.moe is None else "a Qwen3-MoE model"


def check_compatible(hf_args: Qwen3Args, args: Qwen3Args, what: str = "the model") -> None:
    """One-line ValueError unless the two describe the same shapes and function."""
    if (hf_args.moe is None) != (args.moe is None):
        model_type = "qwen3" if hf_args.moe is None else "qwen3_moe"
        raise ValueError(
            f"HF config describes {_kind(hf_args)} (model_type {model_type}), but {what} is "
            f"{_kind(args)}"
        )
    a, b = _signature(hf_args), _signature(args)
    diffs = [
        f"{k} {a.get(k)} vs {b.get(k)}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)
    ]
    if diffs:
        raise ValueError(f"HF config does not match {what} (HF vs ours): {'; '.join(diffs)}")


def matching_flavors(args: Qwen3Args) -> list[str]:
    """Our flavors with exactly ``args``' shapes and function (max_seq_len aside)."""
    sig = _signature(args)
    return [name for name, flavor in MODEL_FLAVORS.items() if _signature(flavor) == sig]
