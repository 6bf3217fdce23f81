import copy
import dataclasses
import math

import pytest
import torch

from torchtitan.models.llama3 import MODEL_FLAVORS, ModelArgs, Transformer, get_model_args
from torchtitan.models.llama3.model import (
    Attention,
    RMSNorm,
    apply_rope,
    precompute_rope_cache,
    rope_frequencies,
)

TINY = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, max_seq_len=64)


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(dataclasses.replace(TINY, **overrides))
    model.init_weights()
    return model


def tokens(bs: int = 2, seqlen: int = 16, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY.vocab_size, (bs, seqlen), generator=g)


# ---------------------------------------------------------------- forward


def test_forward_shape_and_finite():
    logits = tiny_model()(tokens())
    assert logits.shape == (2, 16, TINY.vocab_size)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_logits_stay_in_activation_dtype():
    model = tiny_model().to(torch.bfloat16)
    assert model(tokens()).dtype == torch.bfloat16


def test_sequence_longer_than_rope_cache_is_rejected():
    with pytest.raises(ValueError, match="raise model.max_seq_len"):
        tiny_model(max_seq_len=8)(tokens(seqlen=9))


def test_causal_masking():
    model = tiny_model()
    x = tokens(seqlen=12)
    t = 5
    y = x.clone()
    y[:, t] = (x[:, t] + 1) % TINY.vocab_size
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.equal(a[:, :t], b[:, :t])
    assert not torch.allclose(a[:, t], b[:, t])


def test_gqa_attention_matches_naive_reference():
    torch.manual_seed(0)
    args = TINY
    attn = Attention(args)
    attn.init_weights(0.02)
    x = torch.randn(2, 10, args.dim)
    rope = precompute_rope_cache(args.head_dim, 10, args.rope_theta)
    hd, n_rep = args.head_dim, args.n_heads // args.kv_heads

    q = attn.wq(x).view(2, 10, args.n_heads, hd)
    k = attn.wk(x).view(2, 10, args.kv_heads, hd)
    v = attn.wv(x).view(2, 10, args.kv_heads, hd)
    q, k = apply_rope(q, k, rope)
    # query head h uses kv head h // n_rep
    k, v = k.repeat_interleave(n_rep, dim=2), v.repeat_interleave(n_rep, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
    mask = torch.ones(10, 10, dtype=torch.bool).tril()
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    ref = attn.wo(torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(2, 10, -1))

    torch.testing.assert_close(attn(x, rope), ref, atol=1e-5, rtol=1e-5)


def test_attention_works_on_tensor_parallel_shards():
    # Simulate tp=2 by hand: column-shard wq/wk/wv by heads, row-shard wo; the partial outputs
    # of the two ranks must sum to the full output.
    torch.manual_seed(0)
    args = TINY
    full = Attention(args)
    full.init_weights(0.02)
    x = torch.randn(2, 8, args.dim)
    rope = precompute_rope_cache(args.head_dim, 8, args.rope_theta)
    total = torch.zeros_like(x)
    for rank in range(2):
        shard = copy.deepcopy(full)
        for name in ("wq", "wk", "wv"):
            w = getattr(full, name).weight
            rows = w.shape[0] // 2
            getattr(shard, name).weight = torch.nn.Parameter(w[rank * rows : (rank + 1) * rows])
        cols = full.wo.weight.shape[1] // 2
        shard.wo.weight = torch.nn.Parameter(full.wo.weight[:, rank * cols : (rank + 1) * cols])
        total += shard(x, rope)
    torch.testing.assert_close(total, full(x, rope), atol=1e-5, rtol=1e-5)


def test_under_autocast_the_residual_stream_is_in_autocast_dtype():
    """One GPU runs under bf16 autocast with fp32 weights: the blocks get and return bf16 hidden
    states (as under FSDP's mixed precision), not the embedding's fp32."""
    model = tiny_model()
    seen = []
    for layer in model.layers.values():
        layer.register_forward_hook(lambda m, args, out: seen.append((args[0].dtype, out.dtype)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens())
    assert seen == [(torch.bfloat16, torch.bfloat16)] * TINY.n_layers
    assert torch.isfinite(logits.float()).all()
    seen.clear()
    model(tokens())  # without autocast nothing changes
    assert seen == [(torch.float32, torch.float32)] * TINY.n_layers


# ---------------------------------------------------------------- RoPE


def test_rope_cache_layout():
    cache = precompute_rope_cache(16, 32, theta=10000.0)
    assert cache.shape == (32, 16) and cache.dtype == torch.float32
    cos, sin = cache.chunk(2, dim=-1)
    torch.testing.assert_close(cos[0], torch.ones(8))
    torch.testing.assert_close(sin[0], torch.zeros(8))
    torch.testing.assert_close(cos**2 + sin**2, torch.ones(32, 8))


def test_rope_matches_complex_rotation_of_consecutive_pairs():
    hd, seqlen = 16, 9
    x = torch.randn(2, seqlen, 3, hd)
    out, _ = apply_rope(x, x, precompute_rope_cache(hd, seqlen, theta=10000.0))
    freqs = 10000.0 ** -(torch.arange(0, hd, 2).double() / hd)
    angles = torch.outer(torch.arange(seqlen).double(), freqs)
    rot = torch.polar(torch.ones_like(angles), angles)[None, :, None, :]
    ref = torch.view_as_real(torch.view_as_complex(x.double().unflatten(-1, (-1, 2))) * rot)
    torch.testing.assert_close(out, ref.flatten(-2).float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_is_x_over_its_rms_in_fp32_times_the_weight(dtype):
    """Statistics in fp32 whatever the input's dtype (as Llama's reference norm); the output
    has the input's dtype. bf16: within one bf16 ulp of the fp32 result (statistics computed in
    bf16 are about 2 ulps off)."""
    torch.manual_seed(0)
    norm = RMSNorm(96, eps=1e-5)
    norm.weight.data = torch.randn(96).to(dtype)
    x = (3 * torch.randn(2, 5, 96)).to(dtype)
    xf = x.float()
    expected = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.float()
    out = norm(x)
    assert out.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    else:
        ulp = torch.exp2(torch.floor(torch.log2(expected.abs())) - 7)  # bf16: 8 mantissa bits
        assert ((out.float() - expected).abs() <= ulp).all()


def test_rope_matches_unbinding_and_stacking_the_pairs_bitwise():
    """The pair-swap form (model.py) computes each output with the same two products and one sum
    as rotating the unbound pairs and stacking them back."""
    x = torch.randn(2, 12, 3, 16, dtype=torch.bfloat16)
    cache = precompute_rope_cache(16, 12)
    out, _ = apply_rope(x, x, cache)
    cos, sin = (t[None, :, None, :] for t in cache.chunk(2, dim=-1))
    x0, x1 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    stacked = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
    assert torch.equal(out, stacked.to(torch.bfloat16))


def test_rope_preserves_norm():
    x = torch.randn(2, 50, 4, 32)
    q, k = apply_rope(x, 2 * x, precompute_rope_cache(32, 50))
    torch.testing.assert_close(q.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(k.norm(dim=-1), 2 * x.norm(dim=-1))


def test_rope_dot_product_depends_only_on_relative_position():
    hd, seqlen = 32, 40
    q = torch.randn(hd)
    k = torch.randn(hd)
    q, k = q / q.norm(), k / k.norm()
    cache = precompute_rope_cache(hd, seqlen, theta=10000.0)
    qr, kr = apply_rope(q.expand(1, seqlen, 1, hd), k.expand(1, seqlen, 1, hd), cache)
    qr, kr = qr[0, :, 0], kr[0, :, 0]
    for m, n, shift in [(3, 7, 5), (10, 2, 20), (0, 0, 33)]:
        a = qr[m] @ kr[n]
        b = qr[m + shift] @ kr[n + shift]
        assert abs(a - b) < 1e-5
    # ...but it does depend on the distance: a vector is most similar to itself at distance 0
    qq, _ = apply_rope(q.expand(1, seqlen, 1, hd), q.expand(1, seqlen, 1, hd), cache)
    qq = qq[0, :, 0]
    assert qq[5] @ qq[5] - qq[5] @ qq[15] > 0.01


def test_rope_scaling_follows_llama31_rule():
    hd, theta, factor = 128, 500000.0, 8.0
    plain = precompute_rope_cache(hd, 2, theta)
    scaled = precompute_rope_cache(hd, 2, theta, scaling=True, scaling_factor=factor)

    def freqs_of(cache):  # the angle at position 1 is the frequency itself (all are < pi)
        cos, sin = cache[1].double().chunk(2)
        return torch.atan2(sin, cos)

    n_high = n_low = n_mid = 0
    for i, (f, fs) in enumerate(zip(freqs_of(plain).tolist(), freqs_of(scaled).tolist())):
        f_exact = theta ** (-2 * i / hd)
        assert f == pytest.approx(f_exact, rel=1e-5)
        wavelen = 2 * math.pi / f_exact
        if wavelen < 8192 / 4:  # high frequency: untouched
            expected = f_exact
            assert fs == f  # bit-identical to the unscaled cache
            n_high += 1
        elif wavelen > 8192 / 1:  # low frequency: divided by the factor
            expected = f_exact / factor
            n_low += 1
        else:
            smooth = (8192 / wavelen - 1) / (4 - 1)
            expected = (1 - smooth) * f_exact / factor + smooth * f_exact
            n_mid += 1
        assert fs == pytest.approx(expected, rel=1e-5)
    assert n_high and n_low and n_mid  # all three regimes were exercised


def test_rope_frequencies_unscaled():
    torch.testing.assert_close(
        rope_frequencies(8, 10000.0),
        torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64),
    )


# ---------------------------------------------------------------- init


def meta_init(args: ModelArgs, seed: int = 0) -> Transformer:
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    model.init_weights()
    return model


def test_init_std():
    L = 4
    args = ModelArgs(dim=512, n_layers=L, n_heads=8, n_kv_heads=4, vocab_size=1024)
    model = meta_init(args)

    def std(p):
        return p.detach().float().std().item()

    def close(actual, expected, rel=0.05):
        assert actual == pytest.approx(expected, rel=rel)

    first, last = model.layers["0"], model.layers[str(L - 1)]
    for name in ("wq", "wk", "wv"):
        close(std(getattr(first.attention, name).weight), 0.02)
    close(std(first.feed_forward.w1.weight), 0.02)
    close(std(first.feed_forward.w3.weight), 0.02)
    close(std(first.attention.wo.weight), 0.02 / math.sqrt(2))
    close(std(first.feed_forward.w2.weight), 0.02 / math.sqrt(2))
    close(std(last.attention.wo.weight), 0.02 / math.sqrt(2 * L))
    close(std(last.feed_forward.w2.weight), 0.02 / math.sqrt(2 * L))
    close(std(model.tok_embeddings.weight), 1.0)
    close(std(model.output.weight), 512**-0.5)
    assert model.output.weight.abs().max() <= 3 * 512**-0.5  # truncated at 3 std

    norms = [m.weight for n, m in model.named_modules() if n.endswith("norm")]
    assert len(norms) == 2 * L + 1
    assert all(torch.equal(w, torch.ones_like(w)) for w in norms)

    expected = precompute_rope_cache(
        args.head_dim, args.max_seq_len, args.rope_theta, args.rope_scaling
    )
    assert torch.equal(model.rope_cache, expected)
    assert "rope_cache" not in model.state_dict()


def test_init_without_depth_scaling():
    L = 4
    model = meta_init(ModelArgs(dim=256, n_layers=L, n_heads=4, vocab_size=64, depth_init=False))
    for layer in model.layers.values():
        s = layer.attention.wo.weight.std().item()
        assert s == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.05)


def test_meta_build_gives_finite_output_and_deterministic_init():
    args = dataclasses.replace(TINY, rope_scaling=True)
    a, b = meta_init(args, seed=3), meta_init(args, seed=3)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(meta_init(args, seed=4).output.weight, a.output.weight)
    with torch.no_grad():
        assert torch.isfinite(a(tokens())).all()


def test_init_weights_moves_rope_cache_to_buffer_device():
    model = meta_init(TINY)
    model.init_weights(buffer_device=torch.device("meta"))
    assert model.rope_cache.is_meta and model.output.weight.device.type == "cpu"


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize("flavor", ["debugmodel", "1B", "3B", "8B"])
def test_num_params_matches_built_model(flavor):
    args = MODEL_FLAVORS[flavor]
    with torch.device("meta"):
        model = Transformer(args)
    total = sum(p.numel() for p in model.parameters())
    assert args.num_params() == total
    embedding = model.tok_embeddings.weight.numel()
    assert args.num_params(include_embedding=False) == total - embedding


def test_num_params_with_default_kv_heads():
    args = ModelArgs(dim=48, n_layers=3, n_heads=6, vocab_size=50, ffn_dim_multiplier=1.3)
    assert args.kv_heads == 6
    assert args.num_params() == sum(p.numel() for p in Transformer(args).parameters())


def test_flops_per_token_by_hand():
    # dim 64, 2 layers, 4 heads, 2 kv heads (head_dim 16), vocab 128, ffn hidden 256
    args = TINY
    assert args.ffn_hidden_dim == 256  # int(2 * 256 / 3) = 170 -> rounded up to 256
    per_layer = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 256 + 2 * 64
    non_embedding = 2 * per_layer + 64 + 64 * 128
    assert args.num_params(include_embedding=False) == non_embedding == 131392
    assert args.num_params() == non_embedding + 128 * 64
    seq_len = 100
    assert args.flops_per_token(seq_len) == 6 * 131392 + 12 * 2 * 4 * 16 * seq_len


@pytest.mark.parametrize(
    "flavor, hidden",
    [("1B", 8192), ("3B", 8192), ("8B", 14336), ("70B", 28672), ("405B", 53248)],
)
def test_flavor_ffn_hidden_dim(flavor, hidden):
    assert MODEL_FLAVORS[flavor].ffn_hidden_dim == hidden


def test_flavor_shapes_and_param_counts():
    expected = {
        "1B": (2048, 16, 32, 8, 32.0),
        "3B": (3072, 28, 24, 8, 32.0),
        "8B": (4096, 32, 32, 8, 8.0),
        "70B": (8192, 80, 64, 8, 8.0),
        "405B": (16384, 126, 128, 8, 8.0),
    }
    for name, (dim, n_layers, n_heads, n_kv, factor) in expected.items():
        a = MODEL_FLAVORS[name]
        assert (a.dim, a.n_layers, a.n_heads, a.n_kv_heads) == (dim, n_layers, n_heads, n_kv)
        assert a.vocab_size == 128256 and a.rope_theta == 500000.0
        assert a.rope_scaling and a.rope_scaling_factor == factor
    assert MODEL_FLAVORS["8B"].num_params() == 8_030_261_248
    # 1B with an untied output head; the published 1.24B counts the shared matrix once.
    one_b = MODEL_FLAVORS["1B"]
    assert one_b.num_params() == 1_498_482_688
    assert one_b.num_params(include_embedding=False) == 1_235_814_400
    debug = MODEL_FLAVORS["debugmodel"]
    assert (debug.dim, debug.n_layers, debug.n_heads, debug.n_kv_heads) == (256, 6, 16, 4)
    assert debug.vocab_size == 4096 and not debug.rope_scaling


# ---------------------------------------------------------------- pipeline split


def test_pipeline_stage_cut():
    full = tiny_model(n_layers=3)
    x = tokens()

    first = copy.deepcopy(full)
    del first.layers["1"], first.layers["2"]
    first.norm = None
    first.output = None

    last = copy.deepcopy(full)
    del last.layers["0"]
    last.tok_embeddings = None
    assert list(last.layers.keys()) == ["1", "2"]
    assert "layers.1.attention.wq.weight" in last.state_dict()

    with torch.no_grad():
        hidden = first(x)
        assert hidden.shape == (2, 16, TINY.dim)
        logits = last(hidden)
        torch.testing.assert_close(logits, full(x))

    # init_weights works on a stage with parts removed
    last.init_weights()
    first.init_weights()


# ---------------------------------------------------------------- args


def test_get_model_args_returns_a_copy():
    a = get_model_args("debugmodel", n_layers=2)
    assert a.n_layers == 2 and MODEL_FLAVORS["debugmodel"].n_layers == 6
    assert a is not MODEL_FLAVORS["debugmodel"]


def test_get_model_args_unknown_flavor_suggests_closest():
    with pytest.raises(ValueError, match="unknown model flavor '8b'") as e:
        get_model_args("8b")
    assert "did you mean '8B'" in str(e.value)
    assert "debugmodel, 1B, 3B, 8B, 70B, 405B" in str(e.value)
    with pytest.raises(ValueError, match="did you mean 'debugmodel'"):
        get_model_args("debug_model")


def test_get_model_args_unknown_field():
    with pytest.raises(ValueError, match="unknown model field 'n_layer'.*did you mean 'n_layers'"):
        get_model_args("debugmodel", n_layer=2)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"dim": 100, "n_heads": 16}, "divisible by model.n_heads"),
        ({"n_kv_heads": 5}, "divisible by model.n_kv_heads"),
        ({"dim": 48, "n_heads": 16}, "must be even"),
        ({"n_layers": 0}, "model.n_layers must be positive"),
        ({"vocab_size": -1}, "model.vocab_size must be positive"),
        ({"n_kv_heads": 0}, "model.n_kv_heads must be positive"),
    ],
)
def test_validate_errors(overrides, message):
    args = dataclasses.replace(MODEL_FLAVORS["debugmodel"], **overrides)
    with pytest.raises(ValueError, match=message):
        args.validate()
    with pytest.raises(ValueError, match=message):
        get_model_args("debugmodel", **overrides)


def test_transformer_validates_args():
    with pytest.raises(ValueError, match="must be even"):
        Transformer(dataclasses.replace(TINY, dim=60, n_heads=4, n_kv_heads=2))
