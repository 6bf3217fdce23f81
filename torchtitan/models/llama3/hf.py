"""Hugging Face interoperability for the Llama 3 model: state dicts, config.json, safetensors.

Our ``Transformer`` and ``transformers.LlamaForCausalLM`` compute the same function; only the
parameter names and one detail of RoPE differ:

* RoPE pairs. We rotate *consecutive* pairs ``(x[2i], x[2i+1])`` of each head (Meta's
  convention); HF's ``rotate_half`` rotates ``(x[i], x[i + head_dim/2])``. Both use frequency
  ``i`` for pair ``i``, so reordering the output rows of ``wq`` and ``wk`` inside each head, from
  ``[re_0, im_0, re_1, im_1, ...]`` to ``[re_0, re_1, ..., im_0, im_1, ...]``, makes HF's q/k equal
  to ours up to that same fixed reordering of head dimensions. Attention scores are dot products
  over head dimensions, so they do not change. The reordering is a pure index permutation: the
  round trip is bitwise exact. ``wv``/``wo`` and everything else are copied unchanged.
* Llama 3.1 RoPE scaling (``ModelArgs.rope_scaling``) is HF's ``rope_type: "llama3"`` with
  ``low_freq_factor`` 1, ``high_freq_factor`` 4 and ``original_max_position_embeddings`` 8192 (our
  fixed constants) and ``factor`` = ``ModelArgs.rope_scaling_factor``.

Everything here except ``load_hf_weights`` and the file helpers is a pure function of tensors and
dicts; ``safetensors`` is imported only where files are read.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from torchtitan.models.llama3.args import MODEL_FLAVORS, ModelArgs
from torchtitan.models.llama3.model import (
    ROPE_HIGH_FREQ_FACTOR,
    ROPE_LOW_FREQ_FACTOR,
    ROPE_OLD_CONTEXT_LEN,
)

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"

# Published context length of the Llama 3.1 / 3.2 checkpoints (config.json max_position_embeddings)
LLAMA31_MAX_POSITION_EMBEDDINGS = 131072
# Buffers some old HF checkpoints carry; recomputed by every implementation, never loaded.
_IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)

_TOP_LEVEL = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_PER_LAYER = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP_LEVEL_INV = {v: k for k, v in _TOP_LEVEL.items()}
_PER_LAYER_INV = {v: k for k, v in _PER_LAYER.items()}


# ------------------------------------------------------------------------------------- names


def hf_name(name: str) -> str:
    """Our parameter name -> HF's (``layers.3.attention.wq.weight`` -> ``model.layers.3...``)."""
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and parts[2] in _PER_LAYER:
        return f"model.layers.{parts[1]}.{_PER_LAYER[parts[2]]}"
    raise ValueError(f"unexpected Llama parameter name '{name}'")


def our_name(name: str) -> str:
    """HF's parameter name -> ours."""
    if name in _TOP_LEVEL_INV:
        return _TOP_LEVEL_INV[name]
    parts = name.split(".", 3)
    if (
        len(parts) == 4
        and parts[:2] == ["model", "layers"]
        and parts[2].isdigit()
        and parts[3] in _PER_LAYER_INV
    ):
        return f"layers.{parts[2]}.{_PER_LAYER_INV[parts[3]]}"
    raise ValueError(f"unexpected HF Llama parameter name '{name}'")


def expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Our parameter name -> shape, for every parameter of ``Transformer(args)``."""
    d, hd, hidden = args.dim, args.head_dim, args.ffn_hidden_dim
    per_layer = {
        "attention.wq.weight": (args.n_heads * hd, d),
        "attention.wk.weight": (args.kv_heads * hd, d),
        "attention.wv.weight": (args.kv_heads * hd, d),
        "attention.wo.weight": (d, args.n_heads * hd),
        "feed_forward.w1.weight": (hidden, d),
        "feed_forward.w2.weight": (d, hidden),
        "feed_forward.w3.weight": (hidden, d),
        "attention_norm.weight": (d,),
        "ffn_norm.weight": (d,),
    }
    shapes = {"tok_embeddings.weight": (args.vocab_size, d)}
    for i in range(args.n_layers):
        shapes.update({f"layers.{i}.{k}": v for k, v in per_layer.items()})
    shapes["norm.weight"] = (d,)
    shapes["output.weight"] = (args.vocab_size, d)
    return shapes


def _few(names: Iterable[str], n: int = 3) -> str:
    names = sorted(names)
    more = f" (+{len(names) - n} more)" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def check_keys(
    present: Iterable[str], expected: Iterable[str], what: str, strict: bool = True
) -> None:
    """One-line ValueError for missing keys (always) or unexpected keys (when strict)."""
    present, expected = set(present), set(expected)
    if missing := expected - present:
        raise ValueError(f"{what} is missing {len(missing)} key(s): {_few(missing)}")
    if strict and (unexpected := present - expected):
        raise ValueError(f"{what} has {len(unexpected)} unexpected key(s): {_few(unexpected)}")


# ----------------------------------------------------------------------------- tensor layout


def permute_to_hf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """q/k projection rows, per head: ``[re_0, im_0, re_1, im_1, ...]`` -> ``[re_*, im_*]``."""
    rows, cols = w.shape
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, cols).transpose(1, 2).reshape(rows, cols)


def permute_from_hf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Exact inverse of ``permute_to_hf``."""
    rows, cols = w.shape
    half = rows // n_heads // 2
    return w.reshape(n_heads, 2, half, cols).transpose(1, 2).reshape(rows, cols)


def _heads_to_permute(name: str, args: ModelArgs) -> int | None:
    if name.endswith("attention.wq.weight"):
        return args.n_heads
    if name.endswith("attention.wk.weight"):
        return args.kv_heads
    return None


def to_hf_tensor(name: str, tensor: torch.Tensor, args: ModelArgs) -> tuple[str, torch.Tensor]:
    """One of our parameters -> (HF name, HF tensor)."""
    heads = _heads_to_permute(name, args)
    return hf_name(name), tensor if heads is None else permute_to_hf(tensor, heads)


def from_hf_tensor(name: str, tensor: torch.Tensor, args: ModelArgs) -> tuple[str, torch.Tensor]:
    """One HF parameter -> (our name, our tensor)."""
    ours = our_name(name)
    heads = _heads_to_permute(ours, args)
    return ours, tensor if heads is None else permute_from_hf(tensor, heads)


def check_shapes(shapes: dict[str, tuple[int, ...]], args: ModelArgs, what: str) -> None:
    """shapes are keyed by our names."""
    expected = expected_shapes(args)
    for name, shape in shapes.items():
        if name in expected and tuple(shape) != expected[name]:
            raise ValueError(
                f"{what}: {name} has shape {tuple(shape)}, the model expects {expected[name]}"
            )


def to_hf_state_dict(sd: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """Our full (unsharded) state dict -> HF ``LlamaForCausalLM`` state dict."""
    check_keys(sd, expected_shapes(args), "state dict")
    check_shapes({k: tuple(v.shape) for k, v in sd.items()}, args, "state dict")
    return dict(to_hf_tensor(k, v, args) for k, v in sd.items())


def _skip_hf_key(name: str) -> bool:
    return name.endswith(_IGNORED_HF_SUFFIXES)


def from_hf_state_dict(
    hf_sd: dict[str, torch.Tensor], args: ModelArgs, tie_word_embeddings: bool = False
) -> dict[str, torch.Tensor]:
    """HF ``LlamaForCausalLM`` state dict -> ours.

    With ``tie_word_embeddings`` (Llama 3.2 1B/3B) a missing ``lm_head.weight`` is taken from the
    embedding table: our model never ties, so the output head starts as a copy of it.
    """
    hf_sd = {k: v for k, v in hf_sd.items() if not _skip_hf_key(k)}
    expected = {hf_name(k) for k in expected_shapes(args)}
    if tie_word_embeddings and "lm_head.weight" not in hf_sd:
        expected.discard("lm_head.weight")
    check_keys(hf_sd, expected, "HF state dict")
    sd = dict(from_hf_tensor(k, v, args) for k, v in hf_sd.items())
    if "output.weight" not in sd:
        sd["output.weight"] = sd["tok_embeddings.weight"].clone()
    check_shapes({k: tuple(v.shape) for k, v in sd.items()}, args, "HF state dict")
    return sd


# ------------------------------------------------------------------------------------ config


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


# ------------------------------------------------------------------------------------- files


def read_hf_config(hf_dir: str | Path) -> dict:
    path = Path(hf_dir) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"no {CONFIG_FILE} in {hf_dir}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def hf_weight_files(hf_dir: str | Path) -> list[Path]:
    """The safetensors files of an HF checkpoint: from the index if there is one."""
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise ValueError(f"HF checkpoint folder {hf_dir} does not exist")
    index = hf_dir / SAFETENSORS_INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{index} is not a safetensors index: {e!r}") from None
        files = [hf_dir / name for name in sorted(set(weight_map.values()))]
        if missing := [f.name for f in files if not f.is_file()]:
            raise ValueError(f"{index.name} lists missing file(s): {_few(missing)}")
        return files
    if (hf_dir / SAFETENSORS_FILE).is_file():
        return [hf_dir / SAFETENSORS_FILE]
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        hint = " (convert .bin weights to safetensors first)" if any(hf_dir.glob("*.bin")) else ""
        raise ValueError(f"no *.safetensors files in {hf_dir}{hint}")
    return files


def _safe_open(path: Path):
    try:
        from safetensors import safe_open
    except ImportError:
        raise ValueError(
            "reading HF checkpoints needs the safetensors package: pip install -e '.[hf]'"
        ) from None
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # safetensors raises its own error types
        raise ValueError(f"cannot read {path}: {e}") from None


def hf_tensor_shapes(files: list[Path]) -> dict[str, tuple[tuple[int, ...], Path]]:
    """HF name -> (shape, file), from the safetensors headers only (no tensor data is read)."""
    out = {}
    for path in files:
        with _safe_open(path) as f:
            for key in f.keys():
                if key in out:
                    raise ValueError(f"{key} appears in both {out[key][1].name} and {path.name}")
                out[key] = (tuple(f.get_slice(key).get_shape()), path)
    return out


@dataclasses.dataclass
class HFCheckpoint:
    """A validated HF checkpoint folder."""

    path: Path
    config: dict
    args: ModelArgs  # from config.json
    files: list[Path]
    tie_word_embeddings: bool


def inspect_hf_checkpoint(
    hf_dir: str | Path, args: ModelArgs | None = None, strict: bool = True
) -> HFCheckpoint:
    """Read config.json and the safetensors headers; one-line ValueError if they disagree with
    each other or (when given) with ``args``. No tensor data is read."""
    cfg = read_hf_config(hf_dir)
    hf_args = model_args_from_hf_config(cfg)
    if args is not None:
        check_compatible(hf_args, args)
    files = hf_weight_files(hf_dir)
    shapes = {k: v for k, v in hf_tensor_shapes(files).items() if not _skip_hf_key(k)}
    tie = bool(cfg.get("tie_word_embeddings", False))
    expected = {hf_name(k) for k in expected_shapes(hf_args)}
    if tie and "lm_head.weight" not in shapes:
        expected.discard("lm_head.weight")
    check_keys(shapes, expected, f"HF checkpoint {hf_dir}", strict=strict)
    ours = {our_name(k): shape for k, (shape, _) in shapes.items() if k in expected}
    check_shapes(ours, hf_args, f"HF checkpoint {hf_dir} vs its config.json")
    return HFCheckpoint(Path(hf_dir), cfg, hf_args, files, tie)


def read_hf_file(
    path: Path, args: ModelArgs, tie_word_embeddings: bool, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """One safetensors file, converted to our names and layout (and ``dtype`` if given).

    Keys that are not Llama parameters are skipped (``inspect_hf_checkpoint`` decides whether
    they are an error).
    """
    expected = expected_shapes(args)
    sd = {}
    with _safe_open(path) as f:
        for key in f.keys():
            if _skip_hf_key(key):
                continue
            try:
                name = our_name(key)
            except ValueError:
                continue
            if name not in expected:
                continue
            t = f.get_tensor(key)
            name, t = from_hf_tensor(key, t if dtype is None else t.to(dtype), args)
            sd[name] = t
    if tie_word_embeddings and "tok_embeddings.weight" in sd:
        sd.setdefault("output.weight", sd["tok_embeddings.weight"].clone())
    return sd


# ---------------------------------------------------------------------------------- loading


def _model_keys(model: nn.Module) -> set[str]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    # Local (sharded) state dict: no communication; FQNs without AC/compile/FSDP prefixes.
    return set(get_model_state_dict(model).keys())


def load_hf_weights(
    model: nn.Module | list[nn.Module],
    hf_dir: str | Path,
    args: ModelArgs | None = None,
    strict: bool = True,
) -> None:
    """Load an HF Llama checkpoint (safetensors) into ``model`` in its current layout.

    Call it on every rank, after ``model.to_empty(...)`` and ``model.init_weights()`` (which also
    builds the RoPE cache). ``model`` may be plain, wrapped (AC, compile), sharded (FSDP2/TP
    DTensors), a pipeline stage holding only some of the layers, or a list of such stages (the
    model parts of one rank; every rank must pass the same number). Rank 0 reads the files one at
    a time and broadcasts each tensor; every rank keeps its own shard of the parameters it has,
    so no rank holds more than one file of the checkpoint besides its own shards.

    args: the full model's ModelArgs (default ``model.args``); the HF config must describe the
    same shapes and function. strict: also reject HF tensors that are not Llama parameters.
    Every parameter the model holds must be in the checkpoint, strict or not. Problems raise a
    one-line ValueError on every rank.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    parts = list(model) if isinstance(model, (list, tuple)) else [model]
    args = args if args is not None else parts[0].args
    distributed = dist.is_available() and dist.is_initialized()
    rank0 = not distributed or dist.get_rank() == 0

    # Validate on rank 0 (it alone needs to see the files); share the verdict so that an error
    # is raised on every rank rather than leaving the others waiting in a broadcast.
    error, ckpt = None, None
    if rank0:
        try:
            ckpt = inspect_hf_checkpoint(hf_dir, args, strict=strict)
        except ValueError as e:
            error = str(e)
    if distributed:
        box = [(error, ckpt)]
        dist.broadcast_object_list(box, src=0)
        error, ckpt = box[0]
    if error:
        raise ValueError(error)

    # Every parameter this rank holds must be one of the full model's, and every rank must make
    # the same number of (collective) calls below.
    held = set().union(*(_model_keys(part) for part in parts))
    if unknown := held - set(expected_shapes(args)):
        error = f"model has parameter(s) that {hf_dir} cannot provide: {_few(unknown)}"
    if distributed:
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (error, len(parts)))
        error = next((e for e, _ in gathered if e), None)
        if error is None and len({n for _, n in gathered}) > 1:
            counts = [n for _, n in gathered]
            error = f"ranks pass different numbers of model parts to load_hf_weights: {counts}"
    if error:
        raise ValueError(error)

    # One call per file and part: strict=False because each call carries only that file's
    # tensors (the parameters it leaves out are copied onto themselves).
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed, strict=False)
    for path in ckpt.files:
        sd = read_hf_file(path, args, ckpt.tie_word_embeddings) if rank0 else {}
        for part in parts:
            # set_model_state_dict may rename entries of the dict it is given: pass a copy
            set_model_state_dict(part, dict(sd), options=options)
