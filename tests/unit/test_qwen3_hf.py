"""Qwen3 <-> Hugging Face: the state-dict mapping (dense, MoE, tied and untied), config.json
conversion, and logits parity with transformers' ``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM``.

HF checkpoints are read in their file format (what ``save_pretrained`` writes: one matrix per
expert; transformers 5 fuses the experts in memory and splits them again on save).

Measured (torch 2.13 CPU, transformers 5.25, fp32, eager attention, 2 x 16 random tokens, logits
of O(6)): the largest |logit difference| is about 5e-6 for the MoE model; ATOL is 2e-5.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch

from torchtitan.models.common.moe import MoEArgs
from torchtitan.models.qwen3 import MODEL_FLAVORS, Qwen3Args, Qwen3Transformer, hf

ATOL = 2e-5

SMALL = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=128)
SMALL |= dict(ffn_hidden_dim=96, max_seq_len=64, rope_theta=10000.0)
TINY_MOE = MoEArgs(num_experts=4, top_k=2, hidden_dim=32)
ARGS = {
    "dense": Qwen3Args(**SMALL, tie_embeddings=False),
    "dense_tied": Qwen3Args(**SMALL, tie_embeddings=True),
    "moe": Qwen3Args(**SMALL, tie_embeddings=False, moe=TINY_MOE),
    "moe_tied": Qwen3Args(**SMALL, tie_embeddings=True, moe=TINY_MOE),
}


def transformers_or_skip():
    return pytest.importorskip("transformers", reason="transformers not installed (dev extra)")


def randomize_(module: torch.nn.Module, seed: int) -> None:
    """Every parameter random, norms near 1 (so q_norm and k_norm differ from each other)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if "norm" in name else 0.2 * noise)


def hf_model(args: Qwen3Args, seed: int = 0):
    """A random transformers model of ``args``' shape, from our config.json, in fp32."""
    transformers = transformers_or_skip()
    cls = "Qwen3MoeForCausalLM" if args.moe is not None else "Qwen3ForCausalLM"
    config_cls = "Qwen3MoeConfig" if args.moe is not None else "Qwen3Config"
    config = getattr(transformers, config_cls)(**hf.hf_config_dict(args))
    config._attn_implementation = "eager"
    model = getattr(transformers, cls)(config).eval()
    randomize_(model, seed)
    return model


def hf_checkpoint(model, tmp_path) -> dict[str, torch.Tensor]:
    """The tensors ``save_pretrained`` writes (HF's checkpoint names)."""
    from safetensors.torch import load_file

    model.save_pretrained(tmp_path)
    return load_file(tmp_path / "model.safetensors")


def ours(args: Qwen3Args, seed: int = 0) -> Qwen3Transformer:
    model = Qwen3Transformer(args).eval()
    randomize_(model, seed)
    return model


def tokens(args: Qwen3Args) -> torch.Tensor:
    return torch.randint(0, args.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", list(ARGS))
def test_hf_model_converted_to_ours_gives_the_same_logits(name, tmp_path):
    args = ARGS[name]
    theirs = hf_model(args)
    model = Qwen3Transformer(args).eval()
    model.load_state_dict(hf.from_hf_state_dict(hf_checkpoint(theirs, tmp_path), args))
    assert (model.output.weight is model.tok_embeddings.weight) == args.tie_embeddings
    tok = tokens(args)
    with torch.no_grad():
        expected, got = theirs(tok).logits, model(tok)
    assert expected.abs().max() > 1.0  # not a degenerate comparison
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", list(ARGS))
def test_our_model_exported_loads_in_transformers(name, tmp_path):
    transformers = transformers_or_skip()
    from safetensors.torch import save_file

    args = ARGS[name]
    model = ours(args)
    sd = hf.to_hf_state_dict(model.state_dict(), args)
    assert ("lm_head.weight" in sd) != args.tie_embeddings
    save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(hf.hf_config_dict(args)))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tok = tokens(args)
    with torch.no_grad():
        torch.testing.assert_close(model(tok), theirs(tok).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", list(ARGS))
def test_round_trip_is_exact(name):
    args = ARGS[name]
    sd = ours(args).state_dict()
    back = hf.from_hf_state_dict(hf.to_hf_state_dict(sd, args), args)
    assert back.keys() == sd.keys()
    for key, value in sd.items():
        assert torch.equal(back[key], value), key


def test_experts_split_into_hf_names():
    args = ARGS["moe"]
    sd = ours(args).state_dict()
    out = hf.to_hf_state_dict(sd, args)
    w1 = sd["layers.1.moe.experts.w1"]
    assert torch.equal(out["model.layers.1.mlp.experts.3.gate_proj.weight"], w1[3])
    assert torch.equal(
        out["model.layers.1.mlp.experts.2.up_proj.weight"], sd["layers.1.moe.experts.w3"][2]
    )
    assert torch.equal(
        out["model.layers.0.mlp.experts.0.down_proj.weight"], sd["layers.0.moe.experts.w2"][0]
    )
    assert torch.equal(out["model.layers.0.mlp.gate.weight"], sd["layers.0.moe.router.gate.weight"])
    assert set(out) == hf.expected_hf_names(args)
    assert not any("expert_bias" in k for k in out)


def test_expert_bias_dropped_with_a_warning_and_zero_on_import(caplog):
    args = ARGS["moe"]
    sd = ours(args).state_dict()
    with caplog.at_level(logging.WARNING, logger="torchtitan"):
        hf.to_hf_state_dict(sd, args)
    assert caplog.records == []  # a zero bias changes nothing
    sd["layers.1.moe.router.expert_bias"] = torch.tensor([0.0, 0.01, 0.0, -0.02])
    with caplog.at_level(logging.WARNING, logger="torchtitan"):
        back = hf.from_hf_state_dict(hf.to_hf_state_dict(sd, args), args)
    assert "layers.1.moe.router.expert_bias" in caplog.text
    assert torch.equal(back["layers.1.moe.router.expert_bias"], torch.zeros(4))


def test_names_map_both_ways():
    args = ARGS["dense"]
    for name in hf.expected_shapes(args):
        assert hf.our_name(hf.hf_name(name, args), args) == name
    assert hf.hf_name("layers.1.attention.k_norm.weight", args) == (
        "model.layers.1.self_attn.k_norm.weight"
    )
    with pytest.raises(ValueError, match="no one-to-one HF name"):
        hf.hf_name("layers.0.moe.experts.w1", ARGS["moe"])


def test_conversion_errors():
    args = ARGS["moe"]
    hf_sd = hf.to_hf_state_dict(ours(args).state_dict(), args)
    missing = {k: v for k, v in hf_sd.items() if "experts.3." not in k}
    with pytest.raises(ValueError, match="missing 6 key"):
        hf.from_hf_state_dict(missing, args)
    with pytest.raises(ValueError, match="unexpected key.*experts.4"):
        extra = hf_sd | {"model.layers.0.mlp.experts.4.up_proj.weight": torch.zeros(32, 64)}
        hf.from_hf_state_dict(extra, args)
    bad = hf_sd | {"model.norm.weight": torch.zeros(65)}
    with pytest.raises(ValueError, match=r"norm.weight has shape \(65,\)"):
        hf.from_hf_state_dict(bad, args)
    shared = dataclasses.replace(args, moe=dataclasses.replace(TINY_MOE, num_shared_experts=1))
    with pytest.raises(ValueError, match="no shared experts"):
        hf.to_hf_state_dict(Qwen3Transformer(shared).state_dict(), shared)


@pytest.mark.parametrize("flavor", list(MODEL_FLAVORS))
def test_config_round_trip_for_every_flavor(flavor):
    args = MODEL_FLAVORS[flavor]
    cfg = hf.hf_config_dict(args)
    back = hf.model_args_from_hf_config(cfg)
    hf.check_compatible(back, args)
    assert flavor in hf.matching_flavors(back)
    assert back.max_seq_len == args.max_seq_len


@pytest.mark.parametrize("flavor", ["0.6B", "30B-A3B"])
def test_transformers_reads_our_config(flavor):
    transformers = transformers_or_skip()
    args = MODEL_FLAVORS[flavor]
    cfg = hf.hf_config_dict(args)
    config_cls = "Qwen3MoeConfig" if args.moe is not None else "Qwen3Config"
    config = getattr(transformers, config_cls)(**cfg)
    assert (config.head_dim, config.tie_word_embeddings) == (128, args.tie_embeddings)
    assert config.hidden_size // config.num_attention_heads != config.head_dim
    if args.moe is not None:
        assert (config.num_experts, config.num_experts_per_tok) == (128, 8)
        assert (config.moe_intermediate_size, config.norm_topk_prob) == (768, True)


def test_published_style_config_and_rejections():
    cfg = hf.hf_config_dict(MODEL_FLAVORS["30B-A3B"])
    for key in ("rope_parameters", "rope_scaling"):
        cfg.pop(key)
    args = hf.model_args_from_hf_config(cfg | {"max_position_embeddings": 40960})
    assert (args.rope_theta, args.max_seq_len, args.moe.balance_bias) == (1e6, 40960, True)
    assert hf.matching_flavors(args) == ["30B-A3B"]
    with pytest.raises(ValueError, match="use_sliding_window=True"):
        hf.model_args_from_hf_config(cfg | {"use_sliding_window": True})
    with pytest.raises(ValueError, match="decoder_sparse_step=2"):
        hf.model_args_from_hf_config(cfg | {"decoder_sparse_step": 2})
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        hf.model_args_from_hf_config(cfg | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match=r"HF config does not match the model.*head_dim 64 vs 128"):
        hf.check_compatible(hf.model_args_from_hf_config(cfg | {"head_dim": 64}), args)
