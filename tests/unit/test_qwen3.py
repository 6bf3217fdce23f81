"""Qwen3 model: flavors and their parameter/FLOP counts, the Llama-like layout the composition
relies on, pipeline-stage and KV-cache forwards, initialisation and a short training run.

Hugging Face parity and the checkpoint mapping are in test_qwen3_hf.py.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from torchtitan.config import ConfigError, Model
from torchtitan.models.llama3 import KVCache
from torchtitan.models.qwen3 import (
    MODEL_FLAVORS,
    Qwen3Args,
    Qwen3Transformer,
    get_model_args,
    model_args_from_config,
)
from torchtitan.models.qwen3.rope import apply_rope

DEBUG = ("debugmodel", "debugmodel_tied", "debugmodel_moe")

# Hugging Face's model cards (total parameters; for MoE also activated), in billions.
PUBLISHED_TOTAL = {
    "0.6B": 0.6,
    "1.7B": 1.7,
    "4B": 4.0,
    "8B": 8.2,
    "14B": 14.8,
    "32B": 32.8,
    "30B-A3B": 30.5,
    "235B-A22B": 235.0,
}
PUBLISHED_ACTIVE = {"30B-A3B": 3.3, "235B-A22B": 22.0}


def built(flavor: str, seed: int = 0, **overrides) -> Qwen3Transformer:
    """The flavor with 4 blocks unless told otherwise (enough for a 3-block pipeline split)."""
    torch.manual_seed(seed)
    model = Qwen3Transformer(get_model_args(flavor, **{"n_layers": 4, **overrides}))
    model.init_weights()
    return model


def tokens(vocab: int, bs: int = 2, seqlen: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (bs, seqlen), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("flavor", list(MODEL_FLAVORS))
def test_every_flavor_validates(flavor):
    args = get_model_args(flavor)
    assert args.head_dim % 2 == 0 and args.n_heads % args.kv_heads == 0


@pytest.mark.parametrize("flavor", list(PUBLISHED_TOTAL))
def test_published_sizes_from_args_alone(flavor):
    args = MODEL_FLAVORS[flavor]
    total = args.num_params() / 1e9
    assert total == pytest.approx(PUBLISHED_TOTAL[flavor], rel=0.03)
    if flavor in PUBLISHED_ACTIVE:
        # HF's "activated" figure counts the embedding table too.
        active = args.active_params(include_embedding=True) / 1e9
        assert active == pytest.approx(PUBLISHED_ACTIVE[flavor], rel=0.03)
        assert args.active_params() < args.num_params(include_embedding=False) / 5


def test_30b_a3b_hand_count():
    a = MODEL_FLAVORS["30B-A3B"]
    attn = 2 * 2048 * 32 * 128 + 2 * 2048 * 4 * 128 + 2 * 128
    routed = 3 * 2048 * 768
    block_active = attn + 2048 * 128 + 8 * routed + 2 * 2048
    outside = 2048 + 151936 * 2048  # final norm + untied head
    assert a.active_params() == 48 * block_active + outside
    assert a.block_params() - a.block_active_params() == 120 * routed


@pytest.mark.parametrize("flavor", DEBUG)
def test_num_params_matches_the_built_model(flavor):
    model = Qwen3Transformer(MODEL_FLAVORS[flavor])
    counted = sum(p.numel() for p in model.parameters())  # a tied weight is listed once
    assert counted == MODEL_FLAVORS[flavor].num_params()
    emb = model.tok_embeddings.weight.numel()
    non_emb = counted if MODEL_FLAVORS[flavor].tie_embeddings else counted - emb
    assert MODEL_FLAVORS[flavor].num_params(include_embedding=False) == non_emb


def test_tied_embeddings_counted_once():
    untied, tied = MODEL_FLAVORS["debugmodel"], MODEL_FLAVORS["debugmodel_tied"]
    assert untied.num_params() - tied.num_params() == untied.vocab_size * untied.dim
    # The tied table is the head's weight: a matmul, so it stays in the FLOPs.
    assert tied.flops_per_token(128) == untied.flops_per_token(128)


@pytest.mark.parametrize("flavor", ["debugmodel", "debugmodel_moe", "30B-A3B"])
def test_flops_are_per_block_plus_head(flavor):
    a, seq = MODEL_FLAVORS[flavor], 512
    causal_half = a.n_layers * 6 * a.n_heads * a.head_dim * seq
    parts = a.n_layers * a.block_flops_per_token(seq) + a.head_flops_per_token() + 6 * a.dim
    assert a.flops_per_token(seq) == parts + causal_half
    if a.moe is not None:  # only the routed experts count
        dense_equiv = 6 * a.num_params(include_embedding=False) + 2 * causal_half
        assert a.flops_per_token(seq) < dense_equiv


def test_bad_shapes_and_overrides_raise_one_line():
    with pytest.raises(ValueError, match="unknown model flavor 'debugmodle'.*debugmodel"):
        get_model_args("debugmodle")
    with pytest.raises(ValueError, match="unknown model field 'multiple_of'"):
        get_model_args("debugmodel", multiple_of=256)
    with pytest.raises(ValueError, match="divisible by model.n_kv_heads"):
        get_model_args("debugmodel", n_kv_heads=3)
    with pytest.raises(ValueError, match="head_dim must be even"):
        get_model_args("debugmodel", head_dim=31)
    with pytest.raises(ValueError, match="moe top_k"):
        base = MODEL_FLAVORS["debugmodel_moe"]
        dataclasses.replace(base, moe=dataclasses.replace(base.moe, top_k=9)).validate()


def test_model_args_from_config():
    args = model_args_from_config(Model(flavor="debugmodel", n_kv_heads=8, n_layers=2), 256)
    assert (args.kv_heads, args.n_layers, args.max_seq_len) == (8, 2, 256)
    assert args.head_dim == 32  # explicit, not dim / n_heads
    with pytest.raises(ConfigError, match="ffn_dim_multiplier is a Llama 3 option"):
        model_args_from_config(Model(flavor="debugmodel", ffn_dim_multiplier=1.3), 256)
    with pytest.raises(ConfigError, match=r"divisible.*\(flavor debugmodel with n_kv_heads=5\)"):
        model_args_from_config(Model(flavor="debugmodel", n_kv_heads=5), 256)


@pytest.mark.parametrize("flavor", DEBUG)
def test_llama_like_layout(flavor):
    model = Qwen3Transformer(MODEL_FLAVORS[flavor])
    a = model.args
    assert list(model.layers.keys()) == [str(i) for i in range(a.n_layers)]
    block = model.layers["0"]
    assert block.attention.wq.weight.shape == (a.n_heads * a.head_dim, a.dim)
    assert block.attention.q_norm.weight.shape == (a.head_dim,)
    assert block.attention.k_norm.weight.shape == (a.head_dim,)
    assert hasattr(block, "moe") == (a.moe is not None) != hasattr(block, "feed_forward")
    assert "rope_cache" not in model.state_dict()  # non-persistent
    assert model.rope_cache.shape == (a.max_seq_len, a.head_dim)
    assert (model.output.weight is model.tok_embeddings.weight) == a.tie_embeddings
    if a.moe is not None:
        assert "layers.0.moe.router.expert_bias" in model.state_dict()


@pytest.mark.parametrize("flavor", DEBUG)
def test_forward_shapes_and_deferred_head(flavor):
    model = built(flavor).eval()
    tok = tokens(model.args.vocab_size)
    with torch.no_grad():
        logits = model(tok)
        model.defer_head = True
        hidden = model(tok)
    assert logits.shape == (2, 16, model.args.vocab_size)
    assert hidden.shape == (2, 16, model.args.dim)
    torch.testing.assert_close(hidden @ model.output.weight.t(), logits)


def _split(model: Qwen3Transformer, at: int) -> tuple[Qwen3Transformer, Qwen3Transformer]:
    """Two pipeline stages, split as the composition does (deleting modules)."""
    first, last = copy.deepcopy(model), copy.deepcopy(model)
    for name in list(model.layers.keys()):
        del (last if int(name) < at else first).layers[name]
    first.norm, first.output = None, None
    last.tok_embeddings = None
    return first, last


@pytest.mark.parametrize("flavor", DEBUG)
def test_pipeline_stages_compose_to_the_full_model(flavor):
    model = built(flavor).eval()
    tok = tokens(model.args.vocab_size)
    first, last = _split(model, 3)
    with torch.no_grad():
        hidden = first(tok)
        assert hidden.shape == (2, 16, model.args.dim)
        torch.testing.assert_close(last(hidden), model(tok))
    # A last stage without the embedding still has (its copy of) the tied head.
    assert last.output.weight.shape == (model.args.vocab_size, model.args.dim)


@pytest.mark.parametrize("flavor", ["debugmodel", "debugmodel_moe"])
def test_kv_cache_decoding_matches_full_forward(flavor):
    model = built(flavor).eval()
    tok = tokens(model.args.vocab_size, seqlen=12)
    cache = KVCache(model.args, batch_size=2, max_len=12)
    with torch.no_grad():
        full = model(tok)
        steps = [model(tok[:, :8], cache, 0)]
        steps += [model(tok[:, i : i + 1], cache, i) for i in range(8, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_rope_is_rotate_half():
    head_dim, theta = 8, 10000.0
    model = Qwen3Transformer(
        get_model_args("debugmodel", head_dim=head_dim, rope_theta=theta, max_seq_len=8)
    )
    x = torch.randn(1, 8, 2, head_dim)
    xq, _ = apply_rope(x, x, model.rope_cache)
    torch.testing.assert_close(xq[:, 0], x[:, 0])  # position 0: no rotation
    # Position 3, frequency 1 rotates the pair (x[1], x[1 + head_dim / 2]).
    angle = torch.tensor(3 * theta ** (-2 / head_dim))
    a, b = x[0, 3, :, 1], x[0, 3, :, 1 + head_dim // 2]
    torch.testing.assert_close(xq[0, 3, :, 1], a * angle.cos() - b * angle.sin())
    torch.testing.assert_close(xq[0, 3, :, 5], b * angle.cos() + a * angle.sin())


def test_init_std_untied_and_tied():
    untied, tied = built("debugmodel"), built("debugmodel_tied")
    dim = untied.args.dim
    assert untied.tok_embeddings.weight.std().item() == pytest.approx(1.0, rel=0.02)
    assert untied.output.weight.std().item() == pytest.approx(dim**-0.5, rel=0.1)
    assert tied.output.weight is tied.tok_embeddings.weight
    assert tied.tok_embeddings.weight.std().item() == pytest.approx(dim**-0.5, rel=0.1)
    q_norm = tied.layers["2"].attention.q_norm.weight
    with torch.no_grad():
        q_norm.fill_(3.0)
        tied.init_weights()
    assert torch.equal(q_norm, torch.ones_like(q_norm))


def test_meta_build_then_to_empty_keeps_the_tie():
    with torch.device("meta"):
        model = Qwen3Transformer(MODEL_FLAVORS["debugmodel_tied"])
    model.to_empty(device="cpu")
    assert model.output.weight is not model.tok_embeddings.weight  # to_empty unties...
    model.init_rope_cache()
    assert model.output.weight is model.tok_embeddings.weight  # ...and this re-ties
    assert sum(p.numel() for p in model.parameters()) == model.args.num_params()


def test_q_and_k_norms_change_the_output():
    model = built("debugmodel").eval()
    tok = tokens(model.args.vocab_size)
    with torch.no_grad():
        before = model(tok)
        model.layers["0"].attention.k_norm.weight.mul_(2.0)
        after = model(tok)
    assert (before - after).abs().max() > 1e-3


@pytest.mark.parametrize("flavor", ["debugmodel", "debugmodel_moe"])
def test_loss_falls_on_a_fixed_batch(flavor):
    model = built(flavor, n_layers=2)
    tok = tokens(model.args.vocab_size, bs=4, seqlen=33, seed=3)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        logits = model(tok[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tok[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 2, losses
    if flavor == "debugmodel_moe":
        gate = model.layers["0"].moe.router.gate.weight
        assert gate.grad is not None and gate.grad.abs().sum() > 0


def test_qwen3_args_are_keyword_only():
    with pytest.raises(TypeError):
        Qwen3Args(256, 2, 4)  # type: ignore[misc]
