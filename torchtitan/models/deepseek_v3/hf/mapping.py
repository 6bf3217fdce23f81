"""Parameter names and tensor layout: our DeepSeek-V3 state dict <-> Hugging Face's checkpoint
format (``DeepseekV3ForCausalLM`` safetensors, as DeepSeek publishes them).

Every dense tensor is copied unchanged: our RoPE rotates DeepSeek's interleaved pairs and our
projections keep their row order (per head [no-RoPE | RoPE] queries, [key | value] from the
KV latent, [latent | RoPE key] from ``wkv_a``). Not one-to-one:

* Experts: we stack each MoE block's experts in three (num_experts, ...) tensors, the files hold
  ``mlp.experts.{e}.{gate,up,down}_proj.weight`` (w1 = gate, w3 = up, w2 = down).
* The selection bias: our ``moe.router.expert_bias`` is HF's ``mlp.gate.e_score_correction_bias``
  (both steer the choice of experts only), so it travels both ways.
"""

from __future__ import annotations

import torch

from torchtitan.models.deepseek_v3.args import DeepSeekV3Args
from torchtitan.models.qwen3.hf.mapping import check_keys

_IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)
_TOP_LEVEL = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_ATTENTION = {
    "attention.wkv_a.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attention.kv_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attention.wkv_b.weight": "self_attn.kv_b_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_QUERY_LATENT = {
    "attention.wq_a.weight": "self_attn.q_a_proj.weight",
    "attention.q_norm.weight": "self_attn.q_a_layernorm.weight",
    "attention.wq.weight": "self_attn.q_b_proj.weight",
}
_QUERY_FULL = {"attention.wq.weight": "self_attn.q_proj.weight"}
_DENSE = {
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
}
EXPERT_BIAS = "moe.router.expert_bias"
_MOE = {
    "moe.router.gate.weight": "mlp.gate.weight",
    EXPERT_BIAS: "mlp.gate.e_score_correction_bias",
    "moe.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "moe.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
    "moe.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
}
_EXPERTS = {
    "moe.experts.w1": "gate_proj",
    "moe.experts.w2": "down_proj",
    "moe.experts.w3": "up_proj",
}
_EXPERTS_BY_HF_WEIGHT = {f"{hf}.weight": ours for ours, hf in _EXPERTS.items()}


def _per_layer(args: DeepSeekV3Args, layer: int) -> dict[str, str]:
    """Our per-block name -> HF's, for the tensors of block ``layer`` copied one-to-one."""
    query = _QUERY_LATENT if args.q_lora_rank else _QUERY_FULL
    ffn = _DENSE if layer < args.n_dense_layers else _MOE
    if not args.moe.num_shared_experts:
        ffn = {k: v for k, v in ffn.items() if "shared_experts" not in k}
    return {**_ATTENTION, **query, **ffn}


def _split_layer(name: str, prefix: str) -> tuple[int, str] | None:
    """``{prefix}{i}.{rest}`` -> (i, rest), else None."""
    if not name.startswith(prefix):
        return None
    layer, _, rest = name[len(prefix) :].partition(".")
    return (int(layer), rest) if layer.isdigit() and rest else None


def expected_shapes(args: DeepSeekV3Args) -> dict[str, tuple[int, ...]]:
    """Our state-dict key -> shape: every parameter of ``DeepSeekV3Transformer(args)`` and each
    MoE block's persistent expert bias."""
    d, linears = args.dim, args.attention_linears()
    attention = {f"attention.{n}.weight": (out, k) for n, (k, out) in linears.items()}
    attention |= {"attention.kv_norm.weight": (args.kv_lora_rank,)}
    if args.q_lora_rank:
        attention["attention.q_norm.weight"] = (args.q_lora_rank,)
    attention |= {"attention_norm.weight": (d,), "ffn_norm.weight": (d,)}
    h = args.ffn_hidden_dim
    dense = {"feed_forward.w1.weight": (h, d), "feed_forward.w2.weight": (d, h)}
    dense["feed_forward.w3.weight"] = (h, d)
    m = args.moe
    n, eh, sh = m.num_experts, m.hidden_dim, m.num_shared_experts * m.hidden_dim
    moe = {"moe.router.gate.weight": (n, d), EXPERT_BIAS: (n,)}
    moe |= {
        "moe.experts.w1": (n, eh, d),
        "moe.experts.w2": (n, d, eh),
        "moe.experts.w3": (n, eh, d),
    }
    if sh:
        moe |= {"moe.shared_experts.w1.weight": (sh, d), "moe.shared_experts.w2.weight": (d, sh)}
        moe["moe.shared_experts.w3.weight"] = (sh, d)
    shapes = {"tok_embeddings.weight": (args.vocab_size, d)}
    for i in range(args.n_layers):
        block = attention | (dense if i < args.n_dense_layers else moe)
        shapes |= {f"layers.{i}.{k}": v for k, v in block.items()}
    return shapes | {"norm.weight": (d,), "output.weight": (args.vocab_size, d)}


def check_shapes(
    shapes: dict[str, tuple[int, ...]],
    args: DeepSeekV3Args,
    what: str,
    expected: dict[str, tuple[int, ...]] | None = None,
) -> None:
    """shapes keyed by our names (or by those of ``expected``); names not expected are not
    checked."""
    expected = expected_shapes(args) if expected is None else expected
    for name, shape in shapes.items():
        if name in expected and tuple(shape) != expected[name]:
            raise ValueError(
                f"{what}: {name} has shape {tuple(shape)}, the model expects {expected[name]}"
            )


def hf_name(name: str, args: DeepSeekV3Args) -> str:
    """Our name of a one-to-one tensor -> HF's; the stacked experts have none."""
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    split = _split_layer(name, "layers.")
    if split and split[1] in (table := _per_layer(args, split[0])):
        return f"model.layers.{split[0]}.{table[split[1]]}"
    raise ValueError(f"no one-to-one HF name for DeepSeek-V3 tensor '{name}'")


def our_name(name: str, args: DeepSeekV3Args) -> str:
    """HF's name of a one-to-one tensor -> ours (ValueError for anything else)."""
    inverse = {v: k for k, v in _TOP_LEVEL.items()}
    if name in inverse:
        return inverse[name]
    split = _split_layer(name, "model.layers.")
    if split and split[0] < args.n_layers:
        inverse = {v: k for k, v in _per_layer(args, split[0]).items()}
        if split[1] in inverse:
            return f"layers.{split[0]}.{inverse[split[1]]}"
    raise ValueError(f"unexpected HF DeepSeek-V3 tensor name '{name}'")


def hf_expert_name(layer: int | str, expert: int, ours: str) -> str:
    """HF's name of one expert's matrix of our stacked ``moe.experts.w{1,2,3}``."""
    return f"model.layers.{layer}.mlp.experts.{expert}.{_EXPERTS[ours]}.weight"


def hf_expert_source(name: str, args: DeepSeekV3Args) -> tuple[str, int] | None:
    """HF's name of one expert's matrix -> (our stacked tensor, expert index), else None."""
    split = _split_layer(name, "model.layers.")
    if split is None or split[0] >= args.n_layers or not split[1].startswith("mlp.experts."):
        return None
    expert, _, proj = split[1][len("mlp.experts.") :].partition(".")
    ours = _EXPERTS_BY_HF_WEIGHT.get(proj)
    if not expert.isdigit() or int(expert) >= args.moe.num_experts or ours is None:
        return None
    return f"layers.{split[0]}.{ours}", int(expert)


def is_ignored_hf_key(name: str, args: DeepSeekV3Args | None = None) -> bool:
    """A buffer no implementation loads, or (given ``args``) a tensor of the multi-token
    prediction layers DeepSeek-V3 checkpoints append after the last block."""
    if name.endswith(_IGNORED_HF_SUFFIXES):
        return True
    split = _split_layer(name, "model.layers.")
    return args is not None and split is not None and split[0] >= args.n_layers


def to_hf_tensors(name: str, t: torch.Tensor, args: DeepSeekV3Args) -> dict[str, torch.Tensor]:
    """One tensor of our state dict -> the HF tensors it becomes (one, or one per expert)."""
    split = _split_layer(name, "layers.")
    if split and split[1] in _EXPERTS:
        return {hf_expert_name(split[0], e, split[1]): w for e, w in enumerate(t.unbind(0))}
    return {hf_name(name, args): t}


def to_hf_state_dict(sd: dict[str, torch.Tensor], args: DeepSeekV3Args) -> dict[str, torch.Tensor]:
    """Our full (unsharded) state dict -> HF checkpoint tensors (``save_pretrained`` names)."""
    check_keys(sd, expected_shapes(args), "state dict")
    check_shapes({k: tuple(v.shape) for k, v in sd.items()}, args, "state dict")
    out = {}
    for name, t in sd.items():
        out |= to_hf_tensors(name, t, args)
    return out


def expected_hf_shapes(args: DeepSeekV3Args) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor of an HF checkpoint of this shape."""
    shapes = {}
    for name, shape in expected_shapes(args).items():
        hf = to_hf_tensors(name, torch.empty(shape, device="meta"), args)
        shapes |= {key: tuple(t.shape) for key, t in hf.items()}
    return shapes


def expected_hf_names(args: DeepSeekV3Args) -> set[str]:
    return set(expected_hf_shapes(args))


def from_hf_state_dict(
    hf_sd: dict[str, torch.Tensor], args: DeepSeekV3Args
) -> dict[str, torch.Tensor]:
    """HF checkpoint tensors (already dequantized) -> our state dict."""
    hf_sd = {k: v for k, v in hf_sd.items() if not is_ignored_hf_key(k, args)}
    check_keys(hf_sd, expected_hf_names(args), "HF state dict")
    sd, experts = {}, {}
    for name, t in hf_sd.items():
        if (source := hf_expert_source(name, args)) is not None:
            experts.setdefault(source[0], {})[source[1]] = t
        else:
            sd[our_name(name, args)] = t
    for name, mats in experts.items():
        sd[name] = torch.stack([mats[e] for e in range(args.moe.num_experts)])
    check_shapes({k: tuple(v.shape) for k, v in sd.items()}, args, "HF state dict")
    return sd
