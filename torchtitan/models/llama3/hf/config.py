"""config.json <-> ModelArgs for the Llama 3 model.

Llama 3.1 RoPE scaling (``ModelArgs.rope_scaling``) is HF's ``rope_type: "llama3"`` with
``low_freq_factor`` 1, ``high_freq_factor`` 4 and ``original_max_position_embeddings`` 8192 (our
fixed constants) and ``factor`` = ``ModelArgs.rope_scaling_factor``.
"""

from __future__ import annotations

from collections.abc import Iterator

from torchtitan.models.llama3.args import MODEL_FLAVORS, ModelArgs
from torchtitan.models.llama3.model import (
    ROPE_HIGH_FREQ_FACTOR,
    ROPE_LOW_FREQ_FACTOR,
    ROPE_OLD_CONTEXT_LEN,
)

# Published context length of the Llama 3.1 / 3.2 checkpoints (config.json max_position_embeddings)
LLAMA31_MAX_POSITION_EMBEDDINGS = 131072


def llama3_bos_eos(vocab_size: int) -> tuple[int | None, int | None]:
    """BOS/EOS ids of a Llama 3 style vocabulary: N base tokens, then 256 specials starting with
    <|begin_of_text|>, <|end_of_text|> (128000/128001 for Llama 3, 3840/3841 for ours)."""
    if vocab_size <= 256:
        return None, None
    return vocab_size - 256, vocab_size - 255


def hf_config_dict(
    args: ModelArgs,
    *,
    dtype: str = "float32",
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    max_position_embeddings: int | None = None,
) -> dict:
    """config.json for ``transformers.LlamaConfig`` describing ``Transformer(args)``.

    Written in the format every transformers version reads: ``rope_theta`` + ``rope_scaling``
    (4.x) and the same as ``rope_parameters`` (5.x, which also reads the former).
    bos/eos default to the Llama 3 layout (``llama3_bos_eos``). ``max_position_embeddings``
    defaults to ``args.max_seq_len``, or to Llama 3.1's 131072 when RoPE scaling is on (HF
    expects it to exceed the 8192 pre-scaling context; it is metadata, no buffer is sized by it).
    """
    default_bos, default_eos = llama3_bos_eos(args.vocab_size)
    if max_position_embeddings is None:
        max_position_embeddings = args.max_seq_len
        if args.rope_scaling:
            max_position_embeddings = max(max_position_embeddings, LLAMA31_MAX_POSITION_EMBEDDINGS)
    rope_scaling = None
    if args.rope_scaling:
        rope_scaling = {
            "rope_type": "llama3",
            "factor": float(args.rope_scaling_factor),
            "low_freq_factor": ROPE_LOW_FREQ_FACTOR,
            "high_freq_factor": ROPE_HIGH_FREQ_FACTOR,
            "original_max_position_embeddings": ROPE_OLD_CONTEXT_LEN,
        }
    rope_parameters = {**(rope_scaling or {"rope_type": "default"}), "rope_theta": args.rope_theta}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_hidden_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": rope_parameters,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": default_bos if bos_token_id is None else bos_token_id,
        "eos_token_id": default_eos if eos_token_id is None else eos_token_id,
        "torch_dtype": dtype,
        "dtype": dtype,
    }


def _ffn_candidates(dim: int, intermediate_size: int) -> Iterator[tuple[int, float | None]]:
    """(multiple_of, ffn_dim_multiplier) pairs to try, most conventional first."""
    for flavor in MODEL_FLAVORS.values():
        if flavor.dim == dim:
            yield flavor.multiple_of, flavor.ffn_dim_multiplier
    for multiple_of in (256, 1024, 4096):
        yield multiple_of, None
    # Always reproducible: rounding up to a multiple of intermediate_size itself.
    base = int(2 * (4 * dim) / 3)
    yield intermediate_size, None if base <= intermediate_size else intermediate_size / base


def _require(cfg: dict, key: str):
    if cfg.get(key) is None:
        raise ValueError(f"HF config lacks '{key}'")
    return cfg[key]


def _hf_rope(cfg: dict) -> tuple[float, bool, float]:
    """(rope_theta, rope_scaling, rope_scaling_factor) from a 4.x or 5.x style config.

    Same precedence as transformers 5 (which also reads 4.x files): ``rope_scaling`` over
    ``rope_parameters``, and a ``rope_theta`` inside the chosen dict over the top-level one.
    """
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(params, dict) or (
        "rope_type" not in params
        and "type" not in params
        and any(isinstance(v, dict) for v in params.values())
    ):
        raise ValueError("HF config has per-layer-type rope_parameters, which Llama does not use")
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"HF config has partial_rotary_factor={partial}; this model rotates all")
    theta = params.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)  # HF's default
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return float(theta), False, 8.0
    if rope_type != "llama3":
        raise ValueError(f"HF rope_type '{rope_type}' is not supported (only 'default', 'llama3')")
    fixed = {
        "low_freq_factor": ROPE_LOW_FREQ_FACTOR,
        "high_freq_factor": ROPE_HIGH_FREQ_FACTOR,
        "original_max_position_embeddings": ROPE_OLD_CONTEXT_LEN,
    }
    for key, ours in fixed.items():
        if key not in params or params[key] != ours:
            raise ValueError(
                f"HF llama3 rope scaling has {key}={params.get(key)}; this model supports "
                f"only {ours}"
            )
    return float(theta), True, float(_require(params, "factor"))


def model_args_from_hf_config(cfg: dict, max_seq_len: int | None = None) -> ModelArgs:
    """ModelArgs with exactly the shapes and function of an HF LlamaConfig (as a dict).

    ``max_seq_len`` (our RoPE cache length) defaults to ``max_position_embeddings``.
    """
    if cfg.get("model_type", "llama") != "llama":
        raise ValueError(f"HF config model_type is '{cfg['model_type']}', expected 'llama'")
    unsupported = {
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    }
    for key, ours in unsupported.items():
        if cfg.get(key, ours) != ours:
            raise ValueError(f"HF config has {key}={cfg[key]!r}; this model supports only {ours!r}")
    dim = _require(cfg, "hidden_size")
    n_heads = _require(cfg, "num_attention_heads")
    if cfg.get("head_dim") not in (None, dim // n_heads):
        raise ValueError(
            f"HF config has head_dim={cfg['head_dim']}, but this model needs "
            f"hidden_size / num_attention_heads = {dim // n_heads}"
        )
    intermediate = _require(cfg, "intermediate_size")
    if intermediate <= 0:
        raise ValueError(f"HF config has intermediate_size={intermediate}; it must be positive")
    theta, scaling, factor = _hf_rope(cfg)
    common = dict(
        dim=dim,
        n_layers=_require(cfg, "num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        vocab_size=_require(cfg, "vocab_size"),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),  # LlamaConfig's default
        rope_theta=theta,
        rope_scaling=scaling,
        rope_scaling_factor=factor,
        max_seq_len=max_seq_len or cfg.get("max_position_embeddings") or 2048,
    )
    for multiple_of, multiplier in _ffn_candidates(dim, intermediate):
        args = ModelArgs(**common, multiple_of=multiple_of, ffn_dim_multiplier=multiplier)
        if args.ffn_hidden_dim == intermediate:
            args.validate()
            return args
    raise ValueError(
        f"no multiple_of/ffn_dim_multiplier reproduces intermediate_size={intermediate} "
        f"for hidden_size={dim}"
    )


def _signature(args: ModelArgs) -> dict:
    """Everything that decides the weights' shapes and the function they compute."""
    sig = {
        "dim": args.dim,
        "n_layers": args.n_layers,
        "n_heads": args.n_heads,
        "n_kv_heads": args.kv_heads,
        "vocab_size": args.vocab_size,
        "ffn_hidden_dim": args.ffn_hidden_dim,
        "norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": args.rope_scaling,
    }
    if args.rope_scaling:
        sig["rope_scaling_factor"] = args.rope_scaling_factor
    return sig


def check_compatible(hf_args: ModelArgs, args: ModelArgs, what: str = "the model") -> None:
    """One-line ValueError unless the two describe the same shapes and function."""
    a, b = _signature(hf_args), _signature(args)
    diffs = [
        f"{k} {a.get(k)} vs {b.get(k)}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)
    ]
    if diffs:
        raise ValueError(f"HF config does not match {what} (HF vs ours): {'; '.join(diffs)}")


def matching_flavors(args: ModelArgs) -> list[str]:
    """Our flavors with exactly ``args``' shapes and function (max_seq_len aside)."""
    sig = _signature(args)
    return [name for name, flavor in MODEL_FLAVORS.items() if _signature(flavor) == sig]
