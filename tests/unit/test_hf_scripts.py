"""scripts/convert_to_hf.py and scripts/convert_from_hf.py: the command lines, their outputs
in transformers and in the trainer, and their one-line errors."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import torch

from tests.unit.test_hf import (
    ATOL,
    ROOT,
    assert_same_state_dict,
    hf_model,
    needs_safetensors,
    random_model,
    tokens,
)
from torchtitan.models.llama3 import get_model_args, hf


def run_script(name: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def script_main(name: str):
    """A script's main() imported in-process (cheaper than a subprocess)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_scripts_round_trip(tmp_path, capsys):
    """DCP seed checkpoint -> convert_to_hf -> transformers, and -> convert_from_hf -> the
    manager's initial load: weights come back bitwise (fp32 export), logits agree with HF. Both
    scripts run once as subprocesses (the command line), then in-process for the error cases."""
    needs_safetensors()
    from torchtitan.checkpoint import CheckpointManager, save_seed_checkpoint
    from torchtitan.config import Checkpoint

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
    initial_load = Checkpoint(initial_load_path=str(dcp_out))  # --checkpoint.initial_load_path
    assert CheckpointManager(initial_load, tmp_path / "run", model_parts=fresh).load() == 0
    assert_same_state_dict(fresh.state_dict(), model.state_dict())
    assert_one_line_errors(tmp_path, out, dcp_out, capsys)


def assert_one_line_errors(tmp_path: Path, out: Path, dcp_out: Path, capsys) -> None:
    """The scripts in-process, on test_scripts_round_trip's folders: a 2-layer ``ckpt`` (no
    flavor fits it), its HF export ``out`` and ``dcp_out`` imported back from it."""
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
    assert capsys.readouterr().err == (
        f"error: no complete checkpoint step-5 in {tmp_path / 'ckpt'} (steps: 0)\n"
    )
    x = str(tmp_path / "x")
    assert from_hf(["--hf", str(out), "--out", x, "--flavor", "debugmodel"]) == 1
    assert capsys.readouterr().err.startswith(
        "error: HF config does not match flavor debugmodel (HF vs ours): n_layers 2 vs 6"
    )
    assert from_hf(["--hf", str(tmp_path / "nowhere"), "--out", x]) == 1
    assert capsys.readouterr().err.startswith("error: no config.json in ")
    assert not (tmp_path / "x").exists()


def test_bfloat16_export_then_import_starts_the_trainer(tmp_path, capsys):
    """debugmodel -> convert_to_hf (bf16) -> convert_from_hf --flavor -> the trainer's
    --checkpoint.initial_load_path: it starts from the bf16-rounded weights, exactly."""
    needs_safetensors()
    from safetensors import safe_open
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from torchtitan.checkpoint import save_seed_checkpoint
    from torchtitan.config import parse_args
    from torchtitan.train import Trainer

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

    trainer = Trainer(
        parse_args(
            [
                *("--training.seq_len=16", "--training.local_batch_size=1"),
                *("--training.steps=1", "--metrics.enable_tensorboard=false"),
                f"--job.dump_folder={tmp_path / 'run'}",
                f"--checkpoint.initial_load_path={dcp_dir}",
            ]
        )
    )
    try:
        assert trainer.step == 0
        loaded = get_model_state_dict(trainer.model_parts[0])
    finally:
        trainer.close()
    assert_same_state_dict(loaded, {k: v.bfloat16().float() for k, v in model.state_dict().items()})
