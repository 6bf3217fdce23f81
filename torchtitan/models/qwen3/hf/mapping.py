"""Parameter names and tensor layout: our Qwen3 state dict <-> Hugging Face's checkpoint format
(``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM`` safetensors).

Both use rotate-half RoPE, so every dense tensor is copied unchanged; only names differ. Three
things are not one-to-one:

* Experts. We hold each MoE block's experts as three (num_experts, ...) tensors; the checkpoint
  files hold one matrix per expert, ``mlp.experts.{e}.{gate,up,down}_proj.weight`` (w1 = gate,
  w3 = up, w2 = down). Export unbinds, import stacks; both exact.
* ``moe.router.expert_bias``: aux-loss-free balancing's selection bias. It is training-only and
  HF's router has none, so export drops it: a model trained with a nonzero bias routes some
  tokens differently in transformers (a warning says so). Import sets it to zero.
* Tied embeddings: HF omits ``lm_head.weight``; our state dict lists the shared tensor under
  both ``tok_embeddings.weight`` and ``output.weight``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from torchtitan.models.qwen3.args import Qwen3Args

logger = logging.getLogger("torchtitan")

_IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some checkpoints carry, never loaded

_TOP_LEVEL = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_ATTENTION = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_DENSE = {
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
}
_ROUTER = {"moe.router.gate.weight": "mlp.gate.weight"}
_EXPERTS = {
    "moe.experts.w1": "gate_proj",
    "moe.experts.w2": "down_proj",
    "moe.experts.w3": "up_proj",
}
_EXPERTS_BY_HF_WEIGHT = {f"{hf}.weight": ours for ours, hf in _EXPERTS.items()}
EXPERT_BIAS = "moe.router.expert_bias"


def _per_layer(args: Qwen3Args) -> dict[str, str]:
    """Our per-block name -> HF's, for the tensors copied one-to-one."""
    return {**_ATTENTION, **(_DENSE if args.moe is None else _ROUTER)}


def expected_shapes(args: Qwen3Args) -> dict[str, tuple[int, ...]]:
    """Our state-dict key -> shape: every parameter of ``Qwen3Transformer(args)`` (a tied table
    under both names) and each MoE block's persistent expert bias."""
    d, hd = args.dim, args.head_dim
    block = {
        "attention.wq.weight": (args.n_heads * hd, d),
        "attention.wk.weight": (args.kv_heads * hd, d),
        "attention.wv.weight": (args.kv_heads * hd, d),
        "attention.wo.weight": (d, args.n_heads * hd),
        "attention.q_norm.weight": (hd,),
        "attention.k_norm.weight": (hd,),
        "attention_norm.weight": (d,),
        "ffn_norm.weight": (d,),
    }
    if args.moe is None:
        h = args.ffn_hidden_dim
        block |= {"feed_forward.w1.weight": (h, d), "feed_forward.w2.weight": (d, h)}
        block["feed_forward.w3.weight"] = (h, d)
    else:
        n, h = args.moe.num_experts, args.moe.hidden_dim
        block |= {"moe.router.gate.weight": (n, d), EXPERT_BIAS: (n,)}
        block |= {"moe.experts.w1": (n, h, d), "moe.experts.w2": (n, d, h)}
        block["moe.experts.w3"] = (n, h, d)
    shapes = {"tok_embeddings.weight": (args.vocab_size, d)}
    for i in range(args.n_layers):
        shapes |= {f"layers.{i}.{k}": v for k, v in block.items()}
    return shapes | {"norm.weight": (d,), "output.weight": (args.vocab_size, d)}


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


def check_shapes(
    shapes: dict[str, tuple[int, ...]],
    args: Qwen3Args,
    what: str,
    expected: dict[str, tuple[int, ...]] | None = None,
) -> None:
    """shapes are keyed by our names (or by the names of ``expected``, default
    ``expected_shapes(args)``); names not expected are not checked."""
    expected = expected_shapes(args) if expected is None else expected
    for name, shape in shapes.items():
        if name in expected and tuple(shape) != expected[name]:
            raise ValueError(
                f"{what}: {name} has shape {tuple(shape)}, the model expects {expected[name]}"
            )


def _shapes(sd: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in sd.items()}


def _split_layer(name: str, prefix: str) -> tuple[str, str] | None:
    """``{prefix}{i}.{rest}`` -> (i, rest), else None."""
    if not name.startswith(prefix):
        return None
    layer, _, rest = name[len(prefix) :].partition(".")
    return (layer, rest) if layer.isdigit() and rest else None


def hf_name(name: str, args: Qwen3Args) -> str:
    """Our name of a one-to-one tensor -> HF's (``layers.3.attention.wq.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``); experts and the expert bias have none."""
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    split, table = _split_layer(name, "layers."), _per_layer(args)
    if split and split[1] in table:
        return f"model.layers.{split[0]}.{table[split[1]]}"
    raise ValueError(f"no one-to-one HF name for Qwen3 tensor '{name}'")


def our_name(name: str, args: Qwen3Args) -> str:
    """HF's name of a one-to-one tensor -> ours."""
    inverse = {v: k for k, v in _TOP_LEVEL.items()}
    if name in inverse:
        return inverse[name]
    split, table = _split_layer(name, "model.layers."), _per_layer(args)
    inverse = {v: k for k, v in table.items()}
    if split and split[1] in inverse:
        return f"layers.{split[0]}.{inverse[split[1]]}"
    raise ValueError(f"unexpected HF Qwen3 tensor name '{name}'")


def hf_expert_name(layer: int | str, expert: int, ours: str) -> str:
    """HF's name of one expert's matrix of our stacked ``moe.experts.w{1,2,3}``."""
    return f"model.layers.{layer}.mlp.experts.{expert}.{_EXPERTS[ours]}.weight"


def hf_expert_source(name: str, args: Qwen3Args) -> tuple[str, int] | None:
    """HF's name of one expert's matrix -> (our stacked tensor, expert index), else None
    (``model.layers.3.mlp.experts.5.up_proj.weight`` -> ``("layers.3.moe.experts.w3", 5)``)."""
    split = _split_layer(name, "model.layers.")
    if args.moe is None or split is None or not split[1].startswith("mlp.experts."):
        return None
    expert, _, proj = split[1][len("mlp.experts.") :].partition(".")
    ours = _EXPERTS_BY_HF_WEIGHT.get(proj)
    if not expert.isdigit() or int(expert) >= args.moe.num_experts or ours is None:
        return None
    return f"layers.{split[0]}.{ours}", int(expert)


def _unstack_experts(name: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    layer, rest = _split_layer(name, "layers.")
    return {hf_expert_name(layer, e, rest): w for e, w in enumerate(t.unbind(0))}


def _warn_on_bias(name: str, bias: torch.Tensor) -> None:
    if bool(bias.ne(0).any()):
        logger.warning(
            "dropping %s (max |bias| %.3g): Hugging Face's Qwen3-MoE router has no selection "
            "bias, so the exported model routes some tokens to other experts",
            name,
            float(bias.abs().max()),
        )


def to_hf_tensors(name: str, t: torch.Tensor, args: Qwen3Args) -> dict[str, torch.Tensor]:
    """One tensor of our state dict -> the HF checkpoint tensors it becomes: one, one per expert
    (stacked experts), or none (the expert bias, and a tied head: HF ties lm_head itself)."""
    if name.endswith(EXPERT_BIAS) or (name == "output.weight" and args.tie_embeddings):
        return {}
    if name.split(".", 2)[-1] in _EXPERTS:
        return _unstack_experts(name, t)
    return {hf_name(name, args): t}


def to_hf_state_dict(sd: dict[str, torch.Tensor], args: Qwen3Args) -> dict[str, torch.Tensor]:
    """Our full (unsharded) state dict -> HF checkpoint tensors (``save_pretrained`` names)."""
    if args.moe is not None and args.moe.num_shared_experts:
        raise ValueError("Hugging Face's Qwen3-MoE has no shared experts; cannot export")
    check_keys(sd, expected_shapes(args), "state dict")
    check_shapes(_shapes(sd), args, "state dict")
    out = {}
    for name, t in sd.items():
        if name.endswith(EXPERT_BIAS):
            _warn_on_bias(name, t)
        out |= to_hf_tensors(name, t, args)
    return out


def is_ignored_hf_key(name: str) -> bool:
    """A buffer some HF checkpoints carry that no implementation loads."""
    return name.endswith(_IGNORED_HF_SUFFIXES)


def expected_hf_shapes(args: Qwen3Args) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor of an HF checkpoint of this shape (no lm_head when
    tied)."""
    # What to_hf_tensors makes of each parameter, on shape-only (meta) tensors.
    shapes = {}
    for name, shape in expected_shapes(args).items():
        hf = to_hf_tensors(name, torch.empty(shape, device="meta"), args)
        shapes |= {key: tuple(t.shape) for key, t in hf.items()}
    return shapes


def expected_hf_names(args: Qwen3Args) -> set[str]:
    """Every tensor name of an HF checkpoint of this shape (no lm_head when tied)."""
    return set(expected_hf_shapes(args))


def _stacked_experts(hf_sd: dict[str, torch.Tensor], args: Qwen3Args) -> dict[str, torch.Tensor]:
    """Our stacked expert tensors and zero expert biases, from HF's per-expert matrices."""
    sd = {}
    for i in range(args.n_layers if args.moe is not None else 0):
        for ours in _EXPERTS:
            mats = [hf_sd[hf_expert_name(i, e, ours)] for e in range(args.moe.num_experts)]
            sd[f"layers.{i}.{ours}"] = torch.stack(mats)
        sd[f"layers.{i}.{EXPERT_BIAS}"] = torch.zeros(args.moe.num_experts, dtype=torch.float32)
    return sd


def from_hf_state_dict(hf_sd: dict[str, torch.Tensor], args: Qwen3Args) -> dict[str, torch.Tensor]:
    """HF checkpoint tensors -> our state dict (what ``Qwen3Transformer(args).load_state_dict``
    takes). With tied embeddings a redundant ``lm_head.weight`` is accepted and ignored."""
    hf_sd = {k: v for k, v in hf_sd.items() if not is_ignored_hf_key(k)}
    if args.tie_embeddings:
        hf_sd.pop("lm_head.weight", None)
    check_keys(hf_sd, expected_hf_names(args), "HF state dict")
    sd = _stacked_experts(hf_sd, args)
    for name, t in hf_sd.items():
        if ".mlp.experts." not in name:
            sd[our_name(name, args)] = t
    if args.tie_embeddings:
        sd["output.weight"] = sd["tok_embeddings.weight"]
    check_shapes(_shapes(sd), args, "HF state dict")
    return sd
