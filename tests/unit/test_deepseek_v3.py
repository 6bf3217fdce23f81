"""DeepSeek-V3: multi-head latent attention against the formula written out (fp32), YaRN
against transformers' frequencies, group-limited routing against a per-token loop, the
flavors' sizes and the one-line errors."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from torchtitan.config import ConfigError, Model
from torchtitan.models import family_of
from torchtitan.models.common.moe import MoEArgs
from torchtitan.models.common.router import Router
from torchtitan.models.deepseek_v3 import (
    MODEL_FLAVORS,
    DeepSeekV3Transformer,
    YarnScaling,
    get_model_args,
    model_args_from_config,
)
from torchtitan.models.deepseek_v3.model import Attention
from torchtitan.models.deepseek_v3.rope import precompute_rope_cache, rope_frequencies

YARN = YarnScaling(factor=40.0, original_max_seq_len=32, mscale=1.0, mscale_all_dim=0.8)


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate(x, pos_freqs, factor):
    """Interleaved pairs (x[2i], x[2i+1]) as complex numbers times factor * e^(i pos f_i)."""
    pairs = torch.view_as_complex(x.double().unflatten(-1, (-1, 2)).contiguous())
    rot = torch.polar(torch.full_like(pos_freqs, factor), pos_freqs)
    return torch.view_as_real(pairs * rot).flatten(-2).float()


def _reference_mla(attn: Attention, args, x: torch.Tensor) -> torch.Tensor:
    """MLA of x (bs, seq, dim) written out per head: latents, their norms, decoupled RoPE,
    causal softmax at the YaRN-scaled temperature."""
    bs, seq, _ = x.shape
    eps, h, nope, rope, vd = args.norm_eps, args.n_heads, 8, 8, 12
    q = _rms(x @ attn.wq_a.weight.T, attn.q_norm.weight, eps) @ attn.wq.weight.T
    q = q.view(bs, seq, h, nope + rope)
    kv_a = x @ attn.wkv_a.weight.T
    latent, k_rope = kv_a[..., : args.kv_lora_rank], kv_a[..., args.kv_lora_rank :]
    kv = (_rms(latent, attn.kv_norm.weight, eps) @ attn.wkv_b.weight.T).view(bs, seq, h, nope + vd)
    freqs = rope_frequencies(rope, args.rope_theta, YARN)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * freqs  # (seq, rope / 2)
    m = lambda f: 0.1 * f * math.log(40.0) + 1  # noqa: E731
    factor = m(1.0) / m(0.8)
    q_rope = _rotate(q[..., nope:], angles[None, :, None], factor)
    k_rope = _rotate(k_rope[:, :, None], angles[None, :, None], factor)
    scale = (nope + rope) ** -0.5 * m(0.8) ** 2
    out = torch.empty(bs, seq, h, vd)
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    for head in range(h):
        qh = torch.cat([q[:, :, head, :nope], q_rope[:, :, head]], -1)
        kh = torch.cat([kv[:, :, head, :nope], k_rope[:, :, 0]], -1)
        scores = (qh @ kh.transpose(1, 2) * scale).masked_fill(~causal, float("-inf"))
        out[:, :, head] = scores.softmax(-1) @ kv[:, :, head, nope:]
    return out.flatten(2) @ attn.wo.weight.T


def _tiny_args(**changes):
    base = get_model_args("debugmodel", max_seq_len=48)
    mla = dict(q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8)
    return dataclasses.replace(base, dim=64, n_heads=4, v_head_dim=12, rope_scaling=YARN, **mla)


def test_mla_matches_the_formula():
    torch.manual_seed(0)
    args = _tiny_args()
    attn = Attention(args)
    attn.init_weights(0.02)
    with torch.no_grad():
        for norm in (attn.q_norm, attn.kv_norm):
            norm.weight.copy_(1 + 0.1 * torch.randn_like(norm.weight))
    x = torch.randn(2, 48, 64)
    got = attn(x, precompute_rope_cache(args))
    torch.testing.assert_close(got, _reference_mla(attn, args, x), rtol=1e-5, atol=1e-6)


def test_yarn_matches_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.DeepseekV3Config(
        qk_rope_head_dim=64,
        rope_scaling={
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
        },
    )
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    yarn = dataclasses.replace(YARN, original_max_seq_len=4096)
    torch.testing.assert_close(rope_frequencies(64, 10000.0, yarn).float(), inv_freq)
    cache = precompute_rope_cache(dataclasses.replace(_tiny_args(), rope_scaling=yarn))
    assert cache[0, 0].item() == pytest.approx(factor)


def test_group_limited_routing_matches_a_loop():
    torch.manual_seed(0)
    moe = MoEArgs(
        num_experts=8,
        top_k=2,
        hidden_dim=4,
        score_func="sigmoid",
        num_groups=4,
        top_groups=2,
        route_scale=2.5,
    )
    router = Router(16, moe)
    router.expert_bias.copy_(0.1 * torch.randn(8))
    x = torch.randn(32, 16)
    weights, experts, scores = router(x)
    for t in range(32):
        select = scores[t] + router.expert_bias
        groups = select.view(4, 2).sum(-1)  # two experts per group: the top-2 sum is the sum
        allowed = torch.zeros(8, dtype=torch.bool)
        for g in groups.topk(2).indices:
            allowed[2 * g : 2 * g + 2] = True
        want = select.masked_fill(~allowed, -1e9).topk(2).indices
        assert set(experts[t].tolist()) == set(want.tolist())
        chosen = scores[t, experts[t]]
        torch.testing.assert_close(weights[t], 2.5 * chosen / chosen.sum())


def test_flavor_sizes_are_the_published_ones():
    assert MODEL_FLAVORS["16B"].num_params() == pytest.approx(15.7e9, rel=0.01)
    assert MODEL_FLAVORS["236B"].num_params() == pytest.approx(235.7e9, rel=0.01)
    assert MODEL_FLAVORS["671B"].num_params() == pytest.approx(671.0e9, rel=0.01)
    four = MODEL_FLAVORS["16B-4L"]
    assert (four.n_layers, four.n_dense_layers, four.vocab_size) == (4, 1, 102400)
    args = get_model_args("debugmodel", max_seq_len=32)
    model = DeepSeekV3Transformer(args)
    assert sum(p.numel() for p in model.parameters()) == args.num_params()
    assert [layer.is_moe for layer in model.layers.values()] == [False, True, True, True]


def test_full_query_flavor_runs_forward_and_backward():
    args = dataclasses.replace(get_model_args("debugmodel", max_seq_len=32), q_lora_rank=0)
    model = DeepSeekV3Transformer(args)
    model.init_weights()
    assert not hasattr(model.layers["0"].attention, "wq_a")
    model(torch.randint(0, 4096, (2, 32))).mean().backward()


def test_user_mistakes_are_one_line_errors():
    cfg = Model(name="deepseek_v3", flavor="debugmodel", n_kv_heads=2)
    with pytest.raises(ConfigError, match="n_kv_heads does not apply"):
        model_args_from_config(cfg, 64)
    with pytest.raises(ConfigError, match="unknown model flavor '16b'.*16B"):
        model_args_from_config(Model(name="deepseek_v3", flavor="16b"), 64)
    with pytest.raises(ConfigError, match="n_dense_layers 3 must be in"):
        model_args_from_config(Model(name="deepseek_v3", flavor="671B", n_layers=2), 64)
    with pytest.raises(ValueError, match="top_groups"):
        MoEArgs(num_experts=8, top_k=2, hidden_dim=4, num_groups=4, top_groups=5).validate()


def test_context_parallel_is_refused_in_one_line():
    dims = type("Dims", (), {"cp": 2})()
    reason = family_of("deepseek_v3").unsupported(get_model_args("debugmodel"), dims)
    assert "context parallel" in reason and "\n" not in reason


def test_planner_counts_latent_attention_and_experts():
    from torchtitan.planning.shapes import shapes

    args = MODEL_FLAVORS["16B"]
    s = shapes(args)
    assert set(s.linears) == {"wq", "wkv_a", "wkv_b", "wo"}
    assert s.block_params - 2 * args.dim + args.kv_lora_rank == args.attention_params()
    assert (s.experts, s.top_k, s.shared_ffn) == (64, 6, 2 * 1408)
    assert set(shapes(MODEL_FLAVORS["671B"]).linears) == {"wq_a", "wq", "wkv_a", "wkv_b", "wo"}
