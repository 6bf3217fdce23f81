"""Parameter names and tensor layout: our Llama 3 state dict <-> HF ``LlamaForCausalLM``'s.

Our ``Transformer`` and ``transformers.LlamaForCausalLM`` compute the same function; only the
parameter names and one detail of RoPE differ:

* RoPE pairs. We rotate *consecutive* pairs ``(x[2i], x[2i+1])`` of each head (Meta's
  convention); HF's ``rotate_half`` rotates ``(x[i], x[i + head_dim/2])``. Both use frequency
  ``i`` for pair ``i``, so reordering the output rows of ``wq`` and ``wk`` inside each head, from
  ``[re_0, im_0, re_1, im_1, ...]`` to ``[re_0, re_1, ..., im_0, im_1, ...]``, makes HF's q/k equal
  to ours up to that same fixed reordering of head dimensions. Attention scores are dot products
  over head dimensions, so they do not change. The reordering is a pure index permutation: the
  round trip is bitwise exact. ``wv``/``wo`` and everything else are copied unchanged.

Everything here is a pure function of names, tensors and dicts.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from torchtitan.models.llama3.args import ModelArgs

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


def few_names(names: Iterable[str], n: int = 3) -> str:
    """The first ``n`` names, sorted, and how many more there are: for one-line errors."""
    names = sorted(names)
    more = f" (+{len(names) - n} more)" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def check_keys(
    present: Iterable[str], expected: Iterable[str], what: str, strict: bool = True
) -> None:
    """One-line ValueError for missing keys (always) or unexpected keys (when strict)."""
    present, expected = set(present), set(expected)
    if missing := expected - present:
        raise ValueError(f"{what} is missing {len(missing)} key(s): {few_names(missing)}")
    if strict and (unexpected := present - expected):
        raise ValueError(f"{what} has {len(unexpected)} unexpected key(s): {few_names(unexpected)}")


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


def to_hf_tensors(name: str, tensor: torch.Tensor, args: ModelArgs) -> dict[str, torch.Tensor]:
    """``to_hf_tensor`` as {HF name: tensor}, the form every family's ``hf`` package shares
    (a Qwen3-MoE tensor may become several HF tensors, or none)."""
    return dict([to_hf_tensor(name, tensor, args)])


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


def is_ignored_hf_key(name: str) -> bool:
    """A buffer some HF checkpoints carry that no implementation loads."""
    return name.endswith(_IGNORED_HF_SUFFIXES)


def from_hf_state_dict(
    hf_sd: dict[str, torch.Tensor], args: ModelArgs, tie_word_embeddings: bool = False
) -> dict[str, torch.Tensor]:
    """HF ``LlamaForCausalLM`` state dict -> ours.

    With ``tie_word_embeddings`` (Llama 3.2 1B/3B) a missing ``lm_head.weight`` is taken from the
    embedding table: our model never ties, so the output head starts as a copy of it.
    """
    hf_sd = {k: v for k, v in hf_sd.items() if not is_ignored_hf_key(k)}
    expected = {hf_name(k) for k in expected_shapes(args)}
    if tie_word_embeddings and "lm_head.weight" not in hf_sd:
        expected.discard("lm_head.weight")
    check_keys(hf_sd, expected, "HF state dict")
    sd = dict(from_hf_tensor(k, v, args) for k, v in hf_sd.items())
    if "output.weight" not in sd:
        sd["output.weight"] = sd["tok_embeddings.weight"].clone()
    check_shapes({k: tuple(v.shape) for k, v in sd.items()}, args, "HF state dict")
    return sd
