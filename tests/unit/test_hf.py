"""Hugging Face interop: state-dict conversion and config.json, and parity with transformers.

The conversion tests need nothing beyond torch. Tests that read or write files need
``safetensors`` and tests that run ``transformers.LlamaForCausalLM`` need ``transformers``; both
come with the ``dev`` extra (``pip install -e .[dev]``), and only their absence skips a test.
The helpers here also serve test_hf_load.py (loading into any layout) and test_hf_scripts.py.

Measured (torch 2.13 CPU, transformers 5.24, fp32, eager attention, 2 x 128 random tokens): the
largest |logit difference| between our model and HF's is about 1e-6 with and without Llama 3.1
RoPE scaling (logits are O(5)); the tolerance is 1e-4. Dropping the RoPE scaling from the HF
config moves the logits by 1.8e-2, so the test can tell.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from torchtitan.models.llama3 import MODEL_FLAVORS, ModelArgs, Transformer, hf
from torchtitan.models.llama3.model import apply_rope, precompute_rope_cache

ROOT = Path(__file__).resolve().parents[2]
ATOL = 1e-4  # fp32 logits of O(4); measured differences are ~1e-6

SMALL = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, max_seq_len=128)
ARGS = {
    "gqa": ModelArgs(**SMALL, rope_theta=10000.0),
    # theta 1e4 puts several of head_dim 16's frequencies in the rescaled band
    "rope_scaling": ModelArgs(
        **SMALL, rope_theta=10000.0, rope_scaling=True, rope_scaling_factor=32.0
    ),
}


def needs_safetensors():
    return pytest.importorskip("safetensors", reason="safetensors not installed (dev extra)")


def needs_transformers():
    return pytest.importorskip("transformers", reason="transformers not installed (dev extra)")


def random_model(args: ModelArgs, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(args)
    model.init_weights()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # they start at 1: make their mapping observable
                p.uniform_(0.5, 1.5)
            if name.endswith(("wq.weight", "wk.weight")):  # sharp attention: RoPE matters
                p.mul_(8.0)
            if name.endswith(("wo.weight", "w2.weight")):  # blocks matter next to the embedding
                p.mul_(10.0)
    return model


def tokens(args: ModelArgs, bs: int = 2, seqlen: int = 128, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, args.vocab_size, (bs, seqlen), generator=g)


def write_hf_dir(path: Path, sd: dict, args: ModelArgs, **config_kwargs) -> Path:
    """An HF folder written with the library functions (no scripts)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    hf_sd = {k: v.contiguous() for k, v in hf.to_hf_state_dict(sd, args).items()}
    save_file(hf_sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(hf.hf_config_dict(args, **config_kwargs)))
    return path


def hf_model(path: Path):
    transformers = needs_transformers()
    model = transformers.LlamaForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def assert_same_state_dict(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


# ------------------------------------------------------------------- pure conversion (torch)


def test_permutation_layout_and_inverse():
    # one head of head_dim 4: rows [re0, im0, re1, im1] -> [re0, re1, im0, im1]
    w = torch.arange(4.0)[:, None].expand(4, 3)
    assert hf.permute_to_hf(w, 1)[:, 0].tolist() == [0.0, 2.0, 1.0, 3.0]
    w = torch.randn(2 * 16, 8)
    for heads in (1, 2):
        assert torch.equal(hf.permute_from_hf(hf.permute_to_hf(w, heads), heads), w)
        assert torch.equal(hf.permute_to_hf(hf.permute_from_hf(w, heads), heads), w)


def rotate_half_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """HF's RoPE: pair (i, i + head_dim/2) rotated by frequency i. x: (bs, seq, heads, hd)."""
    angles = torch.arange(x.shape[1], dtype=torch.float64)[:, None] * freqs
    emb = torch.cat([angles, angles], dim=-1).float()[None, :, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


@pytest.mark.parametrize("scaling", [False, True])
def test_permuted_projections_give_hf_rope_the_same_scores(scaling):
    """Why wq/wk are permuted: with the permuted weights, HF's rotate_half RoPE yields the same
    attention scores as our consecutive-pair RoPE (checked here without transformers)."""
    from torchtitan.models.llama3.model import rope_frequencies

    torch.manual_seed(0)
    heads, hd, dim, seq = 2, 16, 32, 40
    wq, wk, x = torch.randn(heads * hd, dim), torch.randn(heads * hd, dim), torch.randn(1, seq, dim)
    cache = precompute_rope_cache(hd, seq, 10000.0, scaling, 32.0)
    q, k = apply_rope((x @ wq.T).view(1, seq, heads, hd), (x @ wk.T).view(1, seq, heads, hd), cache)
    freqs = rope_frequencies(hd, 10000.0, scaling, 32.0)
    hq = rotate_half_rope((x @ hf.permute_to_hf(wq, heads).T).view(1, seq, heads, hd), freqs)
    hk = rotate_half_rope((x @ hf.permute_to_hf(wk, heads).T).view(1, seq, heads, hd), freqs)
    ours = torch.einsum("bqhd,bkhd->bhqk", q, k)
    theirs = torch.einsum("bqhd,bkhd->bhqk", hq, hk)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", list(ARGS))
def test_state_dict_round_trip_is_bitwise(name):
    args = ARGS[name]
    sd = random_model(args).state_dict()
    hf_sd = hf.to_hf_state_dict(sd, args)
    assert "model.layers.1.self_attn.k_proj.weight" in hf_sd and "lm_head.weight" in hf_sd
    assert len(hf_sd) == len(sd) == 2 + 9 * args.n_layers + 1
    q = "layers.0.attention.wq.weight"
    assert not torch.equal(hf_sd["model." + q.replace("attention.wq", "self_attn.q_proj")], sd[q])
    assert_same_state_dict(hf.from_hf_state_dict(hf_sd, args), sd)


def test_names_map_both_ways():
    for name in hf.expected_shapes(ARGS["gqa"]):
        assert hf.our_name(hf.hf_name(name)) == name
    assert hf.hf_name("layers.1.feed_forward.w1.weight") == "model.layers.1.mlp.gate_proj.weight"
    assert (
        hf.hf_name("layers.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    )


def test_tied_embeddings_are_untied_on_import():
    args = ARGS["gqa"]
    hf_sd = hf.to_hf_state_dict(random_model(args).state_dict(), args)
    del hf_sd["lm_head.weight"]
    with pytest.raises(ValueError, match=r"missing 1 key\(s\): lm_head.weight"):
        hf.from_hf_state_dict(hf_sd, args)
    sd = hf.from_hf_state_dict(hf_sd, args, tie_word_embeddings=True)
    assert torch.equal(sd["output.weight"], sd["tok_embeddings.weight"])
    assert sd["output.weight"].data_ptr() != sd["tok_embeddings.weight"].data_ptr()


def test_conversion_errors():
    args = ARGS["gqa"]
    sd = random_model(args).state_dict()
    with pytest.raises(ValueError, match=r"state dict is missing 1 key\(s\): norm.weight$"):
        hf.to_hf_state_dict({k: v for k, v in sd.items() if k != "norm.weight"}, args)
    with pytest.raises(ValueError, match=r"unexpected key\(s\): extra"):
        hf.to_hf_state_dict({**sd, "extra": torch.zeros(1)}, args)
    with pytest.raises(
        ValueError, match=r"norm.weight has shape \(3,\), the model expects \(64,\)"
    ):
        hf.to_hf_state_dict({**sd, "norm.weight": torch.zeros(3)}, args)
    hf_sd = hf.to_hf_state_dict(sd, args)
    hf_sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)  # old HF buffer
    hf.from_hf_state_dict(hf_sd, args)
    with pytest.raises(ValueError, match="unexpected key"):
        hf.from_hf_state_dict(
            {**hf_sd, "model.layers.0.self_attn.q_norm.weight": torch.ones(16)}, args
        )


# ----------------------------------------------------------------------------------- config

# The published config.json values of Meta's Llama 3.1 / 3.2 checkpoints.
PUBLISHED = {
    "1B": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, factor=32.0, tie_word_embeddings=True),
    "3B": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
               num_attention_heads=24, factor=32.0, tie_word_embeddings=True),
    "8B": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, factor=8.0),
    "70B": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                num_attention_heads=64, factor=8.0),
    "405B": dict(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126,
                 num_attention_heads=128, factor=8.0),
}  # fmt: skip


def published_config(flavor: str) -> dict:
    p = dict(PUBLISHED[flavor])
    factor = p.pop("factor")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128256,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": factor,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "torch_dtype": "bfloat16",
        **p,
    }


@pytest.mark.parametrize("flavor", list(PUBLISHED))
def test_published_configs_match_our_flavors(flavor):
    args = hf.model_args_from_hf_config(published_config(flavor))
    assert hf.matching_flavors(args) == [flavor]
    assert (args.multiple_of, args.ffn_dim_multiplier) == (
        MODEL_FLAVORS[flavor].multiple_of,
        MODEL_FLAVORS[flavor].ffn_dim_multiplier,
    )
    assert args.max_seq_len == 131072


@pytest.mark.parametrize("flavor", list(MODEL_FLAVORS))
def test_config_round_trip_for_every_flavor(flavor):
    args = MODEL_FLAVORS[flavor]
    cfg = json.loads(json.dumps(hf.hf_config_dict(args)))
    back = hf.model_args_from_hf_config(cfg, max_seq_len=args.max_seq_len)
    hf.check_compatible(back, args)
    assert back.ffn_hidden_dim == args.ffn_hidden_dim
    assert hf.matching_flavors(back) == [flavor]
    assert cfg["intermediate_size"] == args.ffn_hidden_dim
    assert cfg["tie_word_embeddings"] is False
    if args.rope_scaling:
        assert cfg["rope_scaling"]["rope_type"] == "llama3"
        assert cfg["rope_scaling"]["factor"] == args.rope_scaling_factor
        assert cfg["max_position_embeddings"] == 131072
    if args.vocab_size == 128256:
        assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (128000, 128001)


def test_config_from_transformers_5_format_and_odd_ffn():
    cfg = {
        "hidden_size": 64,
        "intermediate_size": 160,  # not what any multiple_of gives: int(8 * 64 / 3) = 170
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 300,
        "rope_parameters": {"rope_type": "default", "rope_theta": 12345.0},
    }
    args = hf.model_args_from_hf_config(cfg)
    assert args.ffn_hidden_dim == 160
    assert (args.rope_theta, args.rope_scaling, args.kv_heads) == (12345.0, False, 4)
    assert args.norm_eps == 1e-6  # LlamaConfig's default
    assert hf.matching_flavors(args) == []


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_act": "gelu"}, "hidden_act='gelu'; this model supports only 'silu'"),
        ({"attention_bias": True}, "attention_bias=True"),
        ({"head_dim": 32}, "head_dim=32"),
        ({"model_type": "mistral"}, "model_type is 'mistral'"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
        ({"rope_scaling": {**published_config("8B")["rope_scaling"], "high_freq_factor": 2.0}},
         "high_freq_factor=2.0; this model supports only 4.0"),
        ({"hidden_size": None}, "lacks 'hidden_size'"),
        ({"intermediate_size": 0}, "intermediate_size=0; it must be positive"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
    ],
)  # fmt: skip
def test_unsupported_configs_are_rejected(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        hf.model_args_from_hf_config({**published_config("8B"), **change})


def test_config_mismatch_names_every_difference():
    args = hf.model_args_from_hf_config(published_config("8B"))
    with pytest.raises(ValueError, match=r"does not match flavor 70B .*dim 4096 vs 8192; ffn"):
        hf.check_compatible(args, MODEL_FLAVORS["70B"], "flavor 70B")
    other = dataclasses.replace(MODEL_FLAVORS["8B"], rope_theta=10000.0)
    with pytest.raises(ValueError, match="rope_theta 500000.0 vs 10000.0"):
        hf.check_compatible(args, other)


# ------------------------------------------------------------------ against transformers


@pytest.mark.parametrize("name", list(ARGS))
def test_exported_model_matches_transformers(name, tmp_path):
    needs_safetensors()
    needs_transformers()
    args = ARGS[name]
    model = random_model(args)
    path = write_hf_dir(tmp_path / "hf", model.state_dict(), args)
    x = tokens(args)
    with torch.no_grad():
        ours = model(x)
        theirs = hf_model(path)(x).logits
    assert (ours - theirs).abs().max().item() < ATOL
    if args.rope_scaling:  # the comparison is sensitive to the RoPE scaling being carried over
        cfg = json.loads((path / "config.json").read_text())
        cfg["rope_scaling"] = None
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": args.rope_theta}
        (path / "config.json").write_text(json.dumps(cfg))
        with torch.no_grad():
            unscaled = hf_model(path)(x).logits
        assert (ours - unscaled).abs().max().item() > 50 * ATOL
