"""Qwen3 (dense and MoE) <-> Hugging Face end to end: folders written by transformers itself
imported with scripts/convert_from_hf.py and loaded by ``--checkpoint.initial_load_in_hf``'s
``load_hf_weights``, our checkpoints exported with scripts/convert_to_hf.py and read by
``AutoModelForCausalLM``; logits agree in fp32. Tied embeddings stay tied both ways; the MoE
routers' expert_bias is dropped on export (a printed note) and zero on import. Last, sharded
loads (expert parallel, TP, FSDP) over 2 gloo processes (qwen3_hf_sharded_worker.py)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.unit.test_hf_scripts import script_main
from tests.unit.test_qwen3_hf import ATOL, randomize_, tokens, transformers_or_skip
from torchtitan.checkpoint.hf_load import load_hf_weights
from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.models.qwen3 import Qwen3Transformer, hf
from torchtitan.models.qwen3 import get_model_args as qwen3_args

# transformers' own config fields, tiny; the MoE folder's experts spread over several files
SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2)
SHAPE |= dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6)
SHAPE |= dict(max_position_embeddings=64)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
# our debug flavors made tiny (--override on the command line); their vocabulary of 4096 tells
# them from the published flavors' shapes
OVERRIDES = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_hidden_dim=96)
OVERRIDE_FLAGS = [flag for k, v in OVERRIDES.items() for flag in ("--override", f"{k}={v}")]


def _transformers_model(kind: str):
    transformers = transformers_or_skip()
    if kind == "moe":
        config = transformers.Qwen3MoeConfig(**SHAPE, **MOE, tie_word_embeddings=False)
        cls = transformers.Qwen3MoeForCausalLM
    else:
        config = transformers.Qwen3Config(**SHAPE, tie_word_embeddings=True)
        cls = transformers.Qwen3ForCausalLM
    config._attn_implementation = "eager"
    model = cls(config).eval()
    randomize_(model, seed=5)
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{"dense_tied" | "moe": (HF folder saved by transformers, the transformers model)}."""
    root = tmp_path_factory.mktemp("qwen3_hf")
    out = {}
    for kind in ("dense_tied", "moe"):
        model = _transformers_model(kind)
        model.save_pretrained(root / kind, max_shard_size="40KB")
        out[kind] = (root / kind, model)
    return out


def _our_model(path, expert_bias: float = 0.0) -> Qwen3Transformer:
    """A fresh model of the folder's shape; MoE routers' expert_bias set to ``expert_bias``."""
    args = hf.model_args_from_hf_config(json.loads((path / "config.json").read_text()))
    with torch.device("meta"):
        model = Qwen3Transformer(args)
    model.to_empty(device="cpu")
    model.init_weights()
    for name, buffer in model.named_buffers():
        if name.endswith(hf.EXPERT_BIAS):
            buffer.fill_(expert_bias)
    return model.eval()


def _assert_same_logits(ours, theirs, args) -> None:
    x = tokens(args)
    with torch.no_grad():
        expected = theirs(x).logits
        assert expected.abs().max() > 1.0  # not a degenerate comparison
        torch.testing.assert_close(ours(x), expected, atol=ATOL, rtol=0)


def _assert_zero_expert_bias(model) -> None:
    biases = [b for n, b in model.named_buffers() if n.endswith(hf.EXPERT_BIAS)]
    assert all(not b.any() for b in biases)


def test_moe_folder_splits_a_layers_experts_over_files(folders):
    """So reading stacks experts across files (what read_hf_files keeps pending)."""
    path, _ = folders["moe"]
    weight_map = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    files = {f for k, f in weight_map.items() if k.startswith("model.layers.0.mlp.experts.")}
    assert len(files) > 1


@pytest.mark.parametrize("kind", ["dense_tied", "moe"])
def test_convert_from_hf_then_initial_load_gives_transformers_logits(kind, folders, tmp_path):
    from torchtitan.checkpoint import CheckpointManager
    from torchtitan.config import Checkpoint

    path, theirs = folders[kind]
    dcp = tmp_path / "dcp"
    assert script_main("convert_from_hf")(["--hf", str(path), "--out", str(dcp)]) == 0
    model = _our_model(path, expert_bias=0.5)
    manager = CheckpointManager(
        Checkpoint(initial_load_path=str(dcp)), tmp_path / "run", model_parts=model
    )
    assert manager.load() == 0
    assert (model.output.weight is model.tok_embeddings.weight) == (kind == "dense_tied")
    _assert_zero_expert_bias(model)
    _assert_same_logits(model, theirs, model.args)


@pytest.mark.parametrize("kind", ["dense_tied", "moe"])
def test_load_hf_weights_gives_transformers_logits(kind, folders):
    """``--checkpoint.initial_load_in_hf``'s loader, after init_weights as in the trainer."""
    path, theirs = folders[kind]
    model = _our_model(path, expert_bias=0.5)
    load_hf_weights(model, path)
    assert (model.output.weight is model.tok_embeddings.weight) == (kind == "dense_tied")
    _assert_zero_expert_bias(model)
    _assert_same_logits(model, theirs, model.args)


@pytest.mark.parametrize("flavor", ["debugmodel_tied", "debugmodel_moe"])
def test_convert_to_hf_loads_in_transformers_and_imports_back(flavor, tmp_path, capsys):
    """Export (the flavor inferred: tied and untied debugmodel have the same shapes), load with
    AutoModelForCausalLM; import the export back: the same weights, expert_bias zero."""
    transformers = transformers_or_skip()
    from torchtitan.checkpoint import CheckpointManager, save_seed_checkpoint
    from torchtitan.config import Checkpoint

    args = qwen3_args(flavor, **OVERRIDES)
    model = Qwen3Transformer(args).eval()
    randomize_(model, seed=3)
    if args.moe is not None:
        model.layers["1"].moe.router.expert_bias[:3] = torch.tensor([0.0, 0.05, -0.01])
    save_seed_checkpoint(model, tmp_path / "ckpt" / "step-0")
    out, argv = tmp_path / "hf", ["--model-name", "qwen3", "--checkpoint", str(tmp_path / "ckpt")]
    argv += [*OVERRIDE_FLAGS, "--out", str(out), "--dtype", "float32", "--no-tokenizer"]
    argv += ["--max-shard-size", "200KB"]
    assert script_main("convert_to_hf")(argv) == 0
    printed = capsys.readouterr().out
    assert f"(flavor {flavor}," in printed
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] == args.tie_embeddings
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert ("lm_head.weight" in index) != args.tie_embeddings
    assert set(index) == hf.expected_hf_names(args)
    if args.moe is not None:
        assert "note: dropped 2 MoE router expert_bias buffer(s)" in printed
        assert "largest |bias| 0.05" in printed
    for name, buffer in model.named_buffers():  # what transformers routes with
        if name.endswith(hf.EXPERT_BIAS):
            buffer.zero_()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    _assert_same_logits(model, theirs, args)

    assert script_main("convert_from_hf")(["--hf", str(out), "--out", str(tmp_path / "dcp")]) == 0
    fresh = Qwen3Transformer(args)
    manager = CheckpointManager(
        Checkpoint(initial_load_path=str(tmp_path / "dcp")), tmp_path / "run", model_parts=fresh
    )
    assert manager.load() == 0
    back, original = fresh.state_dict(), model.state_dict()
    assert back.keys() == original.keys()
    for key, value in original.items():
        assert torch.equal(back[key], value), key


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_conversion_errors_are_one_line(folders, tmp_path, capsys):
    from torchtitan.checkpoint import save_seed_checkpoint

    to_hf, from_hf = script_main("convert_to_hf"), script_main("convert_from_hf")
    moe_dir, x = str(folders["moe"][0]), str(tmp_path / "x")
    assert from_hf(["--hf", moe_dir, "--out", x, "--flavor", "debugmodel"]) == 1
    assert _one_line_error(capsys) == (
        "error: HF config describes a Qwen3-MoE model (model_type qwen3_moe), but flavor "
        "debugmodel is a dense Qwen3 model\n"
    )
    assert from_hf(["--hf", moe_dir, "--out", x, "--flavor", "70B"]) == 1
    assert _one_line_error(capsys).startswith("error: unknown Qwen3 flavor '70B'")
    assert from_hf(["--hf", moe_dir, "--out", x, "--flavor", "debugmodel_moe"]) == 1
    assert "does not match flavor debugmodel_moe (HF vs ours): dim 64 vs 256" in (
        _one_line_error(capsys)
    )
    mistral = tmp_path / "mistral"
    mistral.mkdir()
    (mistral / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    assert from_hf(["--hf", str(mistral), "--out", x]) == 1
    assert _one_line_error(capsys) == (
        "error: HF config model_type is 'mistral'; this script reads llama (Llama 3); qwen3, "
        "qwen3_moe (Qwen3); deepseek_v3 (DeepSeek-V3)\n"
    )
    assert not (tmp_path / "x").exists()

    model = Qwen3Transformer(qwen3_args("debugmodel", **OVERRIDES))  # untied
    save_seed_checkpoint(model, tmp_path / "ckpt")
    ckpt = ["--checkpoint", str(tmp_path / "ckpt"), *OVERRIDE_FLAGS, "--no-tokenizer", "--out", x]
    assert to_hf(ckpt) == 1
    assert _one_line_error(capsys) == (
        f"error: checkpoint {tmp_path / 'ckpt'} holds a Qwen3 model; pass --model-name qwen3\n"
    )
    assert to_hf(["--model-name", "qwen3", *ckpt, "--flavor", "debugmodel_tied"]) == 1
    assert "flavor debugmodel_tied ties the output head to the embedding table, but in" in (
        _one_line_error(capsys)
    )
    assert to_hf(["--model-name", "qwen3", *ckpt]) == 0
    assert "(flavor debugmodel," in capsys.readouterr().out


def test_initial_load_in_hf_errors(folders, tmp_path, capsys, monkeypatch):
    from torchtitan.preflight import main as preflight

    moe_dir = folders["moe"][0]
    dense = Qwen3Transformer(
        hf.model_args_from_hf_config(
            json.loads((folders["dense_tied"][0] / "config.json").read_text())
        )
    )
    with pytest.raises(ValueError, match=r"^HF config describes a Qwen3-MoE model .*, but the mod"):
        load_hf_weights(dense, moe_dir)
    llama = Transformer(get_model_args("debugmodel", n_layers=1))
    with pytest.raises(ValueError, match=r"^HF config model_type is 'qwen3_moe', expected 'llama'"):
        load_hf_weights(llama, moe_dir)

    monkeypatch.setenv("WORLD_SIZE", "1")
    argv = ["--model.name", "qwen3", "--checkpoint.initial_load_in_hf"]
    argv += ["--checkpoint.initial_load_path", str(moe_dir), f"--job.dump_folder={tmp_path}"]
    assert preflight(argv) == 2
    assert "is a dense Qwen3 model" in _one_line_error(capsys)


# --------------------------------------------------------------------- sharded (2 processes)


def _sharded_folder(path, argv: list[str]) -> dict[str, torch.Tensor]:
    """An HF folder (transformers' save_pretrained, several files) of the model ``argv`` asks
    for; -> the state dict it holds, in our names."""
    from safetensors.torch import load_file

    from torchtitan.config import parse_args
    from torchtitan.models import model_args_from_config

    transformers = transformers_or_skip()
    cfg = parse_args(argv)
    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    name = "Qwen3Moe" if args.moe is not None else "Qwen3"
    config = getattr(transformers, f"{name}Config")(**hf.hf_config_dict(args))
    theirs = getattr(transformers, f"{name}ForCausalLM")(config)
    randomize_(theirs, seed=7)
    theirs.save_pretrained(path, max_shard_size="300KB")
    hf_sd = {}
    for file in path.glob("*.safetensors"):
        hf_sd |= load_file(file)
    return {k: v.clone() for k, v in hf.from_hf_state_dict(hf_sd, args).items()}


def test_load_hf_weights_into_expert_parallel_tp_and_fsdp_models(tmp_path, monkeypatch):
    """The preflight accepts the folders; models built by the trainer's composition over 2 gloo
    ranks (experts sharded on the expert dimension: EP2 with FSDP on the rest, EP2 x TP2; two
    pipeline stages; a tied model under FSDP) load every tensor exactly. (The worker also runs
    EP2 x FSDP2 and EP4 on 4 ranks.)"""
    import os
    import subprocess
    import sys

    from tests.unit.qwen3_hf_sharded_worker import MOE_ARGV, TIED_ARGV
    from tests.unit.test_hf import ROOT
    from torchtitan.preflight import main as preflight

    monkeypatch.setenv("WORLD_SIZE", "1")
    argv = []
    for kind, model_argv in (("moe", MOE_ARGV), ("tied", TIED_ARGV)):
        sd = _sharded_folder(tmp_path / kind, model_argv)
        torch.save(sd, tmp_path / f"{kind}.pt")
        argv += [str(tmp_path / kind), str(tmp_path / f"{kind}.pt")]
        hf_load = ["--checkpoint.initial_load_in_hf", f"--job.dump_folder={tmp_path / 'run'}"]
        hf_load += [f"--checkpoint.initial_load_path={tmp_path / kind}"]
        assert preflight([*model_argv, *hf_load]) == 0
    assert len(list((tmp_path / "moe").glob("*.safetensors"))) > 1
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    r = subprocess.run(
        [*cmd, str(ROOT / "tests" / "unit" / "qwen3_hf_sharded_worker.py"), *argv],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} moe_ep2_fsdp ok 29 " in r.stdout, r.stdout
        assert f"rank {rank} moe_tp2_ep2 ok 29 " in r.stdout
        assert f"rank {rank} tied_fsdp ok 25 -" in r.stdout
    # 2 pipeline stages: both blocks + embeddings on rank 0 (13 x 2 + 1), norm and head on rank 1
    assert "rank 0 moe_pp2 ok 27 plain" in r.stdout and "rank 1 moe_pp2 ok 2 -" in r.stdout
    ep_line = next(line for line in r.stdout.splitlines() if "moe_ep2_fsdp" in line)
    assert "Shard(dim=0)" in ep_line and "'ep'" in ep_line, ep_line
