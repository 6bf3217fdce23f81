"""Hugging Face interop: state-dict conversion, config.json, safetensors loading, the scripts.

The pure conversion tests need nothing beyond torch. Tests that read or write files need
``safetensors`` and tests that run ``transformers.LlamaForCausalLM`` need ``transformers``; both
come with the ``dev`` extra (``pip install -e .[dev]``), and only their absence skips a test.

Measured (torch 2.13 CPU, transformers 5.24, fp32, eager attention, 2 x 128 random tokens): the
largest |logit difference| between our model and HF's is about 1e-6 with and without Llama 3.1
RoPE scaling (logits are O(5)); the tolerance is 1e-4. Dropping the RoPE scaling from the HF
config moves the logits by 1.8e-2, so the test can tell.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from torchtitan.models.llama3 import MODEL_FLAVORS, ModelArgs, Transformer, get_model_args, hf
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


def run_script(name: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


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


def test_import_of_a_transformers_model(tmp_path):
    """A model created and saved by transformers itself (its own config format, tied embeddings,
    sharded safetensors, an intermediate_size no flavor has) loads and computes the same."""
    needs_safetensors()
    transformers = needs_transformers()
    rope = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    rope["original_max_position_embeddings"] = 8192
    if int(transformers.__version__.split(".")[0]) >= 5:
        rope_kwargs = {"rope_parameters": {**rope, "rope_theta": 1e4}}
    else:
        rope_kwargs = {"rope_scaling": rope, "rope_theta": 1e4}
    cfg = transformers.LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16384,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        **rope_kwargs,
    )
    torch.manual_seed(0)
    theirs = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path / "hf"
    theirs.save_pretrained(str(path), max_shard_size="100KB")
    assert (path / hf.SAFETENSORS_INDEX_FILE).is_file()

    ckpt = hf.inspect_hf_checkpoint(path)
    assert len(ckpt.files) > 1 and ckpt.tie_word_embeddings
    args = dataclasses.replace(ckpt.args, max_seq_len=128)
    assert args.rope_scaling and args.rope_scaling_factor == 32.0 and args.ffn_hidden_dim == 160
    ours = Transformer(args)
    ours.init_weights()
    hf.load_hf_weights(ours, path)
    x = tokens(args)
    with torch.no_grad():
        diff = (ours(x) - theirs(x).logits).abs().max().item()
    assert diff < ATOL


# ---------------------------------------------------------------------------- load_hf_weights


@pytest.mark.parametrize("wrap", ["plain", "full_ac", "compile", "two_parts"])
def test_load_hf_weights_into_fresh_model(wrap, tmp_path):
    needs_safetensors()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from torchtitan.parallel import apply_ac, apply_compile

    args = ARGS["rope_scaling"]
    sd = random_model(args).state_dict()
    path = write_hf_dir(tmp_path / "hf", sd, args)
    fresh = random_model(args, seed=1)
    parts = [fresh]
    if wrap == "full_ac":
        apply_ac(fresh, "full")
        assert any("_checkpoint_wrapped_module" in k for k, _ in fresh.named_parameters())
    elif wrap == "compile":  # wraps the blocks; nothing is compiled until a forward
        apply_compile(fresh)
        assert any("_orig_mod" in k for k, _ in fresh.named_parameters())
    elif wrap == "two_parts":  # a pipeline rank's model parts (stages), loaded in one call
        second = random_model(args, seed=2)
        del fresh.layers["1"], second.layers["0"]
        fresh.norm = fresh.output = second.tok_embeddings = None
        parts = [fresh, second]
    hf.load_hf_weights(parts if wrap == "two_parts" else fresh, path)
    loaded = {}
    for part in parts:
        loaded.update(get_model_state_dict(part))
    assert_same_state_dict(loaded, sd)


def test_load_hf_weights_errors(tmp_path):
    needs_safetensors()
    from safetensors.torch import load_file, save_file

    args = ARGS["gqa"]
    sd = random_model(args).state_dict()
    model = random_model(args, seed=1)
    with pytest.raises(ValueError, match=r"^no config.json in .*missing$"):
        hf.load_hf_weights(model, tmp_path / "missing")
    path = write_hf_dir(tmp_path / "hf", sd, args)
    with pytest.raises(ValueError, match=r"does not match the model .*n_layers 2 vs 3"):
        hf.load_hf_weights(model, path, dataclasses.replace(args, n_layers=3))

    weights = path / "model.safetensors"
    tensors = load_file(str(weights))
    weights.unlink()
    with pytest.raises(ValueError, match=r"^no \*.safetensors files in "):
        hf.load_hf_weights(model, path)

    save_file({k: v for k, v in tensors.items() if k != "model.norm.weight"}, str(weights))
    with pytest.raises(ValueError, match=r"is missing 1 key\(s\): model.norm.weight$"):
        hf.load_hf_weights(model, path)

    save_file({**tensors, "model.layers.0.self_attn.q_norm.weight": torch.ones(16)}, str(weights))
    with pytest.raises(ValueError, match=r"has 1 unexpected key\(s\): model.layers.0.self_attn"):
        hf.load_hf_weights(model, path)
    hf.load_hf_weights(model, path, strict=False)
    assert_same_state_dict(model.state_dict(), sd)

    bad = {**tensors, "model.norm.weight": torch.ones(65)}
    save_file(bad, str(weights))
    with pytest.raises(ValueError, match=r"norm.weight has shape \(65,\), the model expects \(64,"):
        hf.load_hf_weights(model, path)

    index = {"weight_map": {k: "model-00001-of-00002.safetensors" for k in tensors}}
    (path / hf.SAFETENSORS_INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"lists missing file\(s\): model-00001-of-00002"):
        hf.load_hf_weights(model, path)


# ------------------------------------------------------------------------------------ scripts


def script_main(name: str):
    """A script's main() imported in-process (cheaper than a subprocess)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_scripts_round_trip(tmp_path, capsys):
    """DCP seed checkpoint -> convert_to_hf -> transformers, and -> convert_from_hf -> the
    trainer's loader: weights come back bitwise (fp32 export), logits agree with HF. Both
    scripts run once as subprocesses (the command line), then in-process for the error cases."""
    needs_safetensors()
    from torchtitan.checkpoint import load_model_weights, save_seed_checkpoint

    args = get_model_args("debugmodel", n_layers=2)
    model = random_model(args)
    save_seed_checkpoint(model, tmp_path / "ckpt" / "step-0")
    out = tmp_path / "hf"
    # the flavor is inferred from the shapes; n_layers=2 overrides debugmodel's 6
    r = run_script(
        "convert_to_hf.py",
        *("--checkpoint", str(tmp_path / "ckpt"), "--override", "n_layers=2"),
        *("--out", str(out), "--dtype", "float32", "--max-shard-size", "2MB"),
    )
    assert r.returncode == 0, r.stderr
    assert "flavor debugmodel" in r.stdout
    index = json.loads((out / hf.SAFETENSORS_INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) > 1
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (3840, 3841)  # bundled tokenizer
    assert not (tmp_path / "hf.tmp").exists()
    if importlib.util.find_spec("transformers") is not None:
        x = tokens(args)
        with torch.no_grad():
            assert (model(x) - hf_model(out)(x).logits).abs().max().item() < ATOL

    dcp_out = tmp_path / "dcp"
    r = run_script("convert_from_hf.py", "--hf", str(out), "--out", str(dcp_out))
    assert r.returncode == 0, r.stderr
    assert "matches none of the flavors" in r.stdout  # 2 layers: not debugmodel
    assert not (tmp_path / "dcp.tmp").exists()
    fresh = random_model(args, seed=1)
    load_model_weights(fresh, dcp_out)  # what --checkpoint.initial_load_path does
    assert_same_state_dict(fresh.state_dict(), model.state_dict())

    to_hf, from_hf = script_main("convert_to_hf"), script_main("convert_from_hf")
    capsys.readouterr()
    assert to_hf(["--checkpoint", str(tmp_path / "ckpt"), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: output folder") and "already exists and is not empty" in err
    assert err.count("\n") == 1
    assert from_hf(["--hf", str(out), "--out", str(dcp_out)]) == 1
    assert "already exists and is not empty" in capsys.readouterr().err

    assert to_hf(["--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "y")]) == 1
    assert capsys.readouterr().err == (
        f"error: no flavor fits the shapes in {tmp_path / 'ckpt' / 'step-0'}; "
        "pass --flavor (and --override)\n"
    )
    assert to_hf(["--checkpoint", str(tmp_path / "ckpt"), "--step", "5", "--out", "y"]) == 1
    assert "no complete DCP checkpoint at" in capsys.readouterr().err
    x = str(tmp_path / "x")
    assert from_hf(["--hf", str(out), "--out", x, "--flavor", "debugmodel"]) == 1
    assert capsys.readouterr().err.startswith(
        "error: HF config does not match flavor debugmodel (HF vs ours): n_layers 2 vs 6"
    )
    assert from_hf(["--hf", str(tmp_path / "nowhere"), "--out", x]) == 1
    assert capsys.readouterr().err.startswith("error: no config.json in ")
    assert not (tmp_path / "x").exists()


def test_convert_to_hf_bfloat16_and_flavor_match(tmp_path, capsys):
    needs_safetensors()
    from safetensors import safe_open

    from torchtitan.checkpoint import save_seed_checkpoint

    args = get_model_args("debugmodel")
    model = random_model(args)
    save_seed_checkpoint(model, tmp_path / "step-0")
    to_hf, from_hf = script_main("convert_to_hf"), script_main("convert_from_hf")
    assert to_hf(["--checkpoint", str(tmp_path / "step-0"), "--out", str(tmp_path / "hf")]) == 0
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        wq = f.get_tensor("model.layers.3.self_attn.q_proj.weight")
    assert wq.dtype == torch.bfloat16
    expected = hf.permute_to_hf(model.state_dict()["layers.3.attention.wq.weight"], args.n_heads)
    assert torch.equal(wq, expected.bfloat16())
    capsys.readouterr()
    hf_dir, dcp_dir = str(tmp_path / "hf"), str(tmp_path / "dcp")
    assert from_hf(["--hf", hf_dir, "--out", dcp_dir, "--flavor", "debugmodel"]) == 0
    assert "matches flavor debugmodel" in capsys.readouterr().out


# --------------------------------------------------------------------- sharded (2 processes)

WORKER = textwrap.dedent(
    """
    import os, sys
    import torch, torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.models.llama3 import ModelArgs, Transformer
    from torchtitan.models.llama3.hf import load_hf_weights
    from torchtitan.parallel import apply_fsdp, apply_tp, llama_block_plan, llama_root_plan

    hf_dir, expected_file, device = sys.argv[1], sys.argv[2], sys.argv[3]
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh(device, (2,))
    expected = torch.load(expected_file)
    args = ModelArgs(**{ARGS})

    def stage(layer, rank_mesh=None):  # a pipeline stage holding one of the two layers
        with torch.device("meta"):
            model = Transformer(args)
        del model.layers[str(1 - layer)]
        if layer == 0:
            model.norm = model.output = None
        else:
            model.tok_embeddings = None
        if rank_mesh is not None:
            apply_fsdp(model, rank_mesh)
        return model

    for layout in ("fsdp", "tp", "pipeline", "parts"):
        if layout in ("fsdp", "tp"):
            with torch.device("meta"):
                parts = [Transformer(args)]
            if layout == "fsdp":  # bf16 mixed precision; the sharded parameters stay fp32
                apply_fsdp(parts[0], mesh)
            else:
                apply_tp(parts[0], mesh, llama_root_plan(), llama_block_plan())
        elif layout == "pipeline":  # 2 stages: stage r on rank r
            parts = [stage(rank)]
        else:  # 2 FSDP-sharded parts per rank, as a looped schedule has
            parts = [stage(0, mesh), stage(1, mesh)]
        for part in parts:
            part.to_empty(device=device)
            part.init_weights()
        load_hf_weights(parts if layout == "parts" else parts[0], hf_dir, args)
        n = 0
        for part in parts:
            full = get_model_state_dict(part, options=StateDictOptions(full_state_dict=True))
            assert full, layout
            for k, v in full.items():
                assert v.dtype == torch.float32 and torch.equal(v.cpu(), expected[k]), (layout, k)
            n += len(full)
        print(f"rank {rank} {layout} ok {n}", flush=True)
    try:
        load_hf_weights(parts, hf_dir + "-missing", args)
    except ValueError as e:
        print(f"rank {rank} error ok: {e}", flush=True)
    dist.destroy_process_group()
    """
)

# cpu (gloo) here; HF_TEST_DEVICE=cuda runs the same check over NCCL on 2 GPUs
DEVICE = os.environ.get("HF_TEST_DEVICE", "cpu")


def test_load_hf_weights_into_sharded_models(tmp_path):
    """FSDP2, TP, a pipeline stage and two FSDP-sharded stages per rank (2 gloo processes): rank 0
    reads, every rank gets its shard; bf16 files become exactly the bf16-rounded fp32 weights;
    errors reach every rank."""
    needs_safetensors()
    args = ARGS["gqa"]
    sd = random_model(args).state_dict()
    path = write_hf_dir(tmp_path / "hf", {k: v.bfloat16() for k, v in sd.items()}, args)
    torch.save({k: v.bfloat16().float() for k, v in sd.items()}, tmp_path / "expected.pt")
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    script = tmp_path / "worker.py"
    script.write_text(WORKER.replace("{ARGS}", repr(fields)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    r = subprocess.run(
        [*cmd, str(script), str(path), str(tmp_path / "expected.pt"), DEVICE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    n = len(sd)
    for rank in (0, 1):
        for layout in ("fsdp", "tp", "parts"):
            assert f"rank {rank} {layout} ok {n}" in r.stdout
        assert f"rank {rank} error ok: no config.json in" in r.stdout
    # each pipeline stage holds one layer + its end: 9 + 1 (embedding) or 9 + 2 (norm, output)
    assert "rank 0 pipeline ok 10" in r.stdout and "rank 1 pipeline ok 11" in r.stdout
