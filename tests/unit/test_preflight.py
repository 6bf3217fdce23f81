"""User mistakes fail in one line before any heavy work (preflight and run_train.sh)."""

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchtitan.preflight import main as preflight

ROOT = Path(__file__).resolve().parents[2]


def write_tokenizer(path: Path, n_base: int) -> Path:
    tokens = [bytes([b]) for b in range(256)]
    tokens += [bytes([a, b]) for a in range(97, 123) for b in range(256)][: n_base - 256]
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(tokens)))
    return path


def run_preflight(capsys, *argv) -> str:
    code = preflight(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--model.tokenizer_path", "/nope/tokenizer.model"], "tokenizer file not found"),
        (["--training.dataset", "/nope/data.jsonl"], "dataset path not found"),
        (["--training.seq_len", "-1"], "seq_len must be positive"),
        (["--training.steps", "abc"], "expects int"),
        (["--model.flavor", "8b"], "did you mean '8B'"),
        (["--job.config_file", "/nope.toml"], "config file not found"),
        (["--parallelism.tensor_parallel_degree", "2"], "tensor_parallel_degree=2"),
    ],
)
def test_bad_input_is_one_line(capsys, argv, expected):
    assert expected in run_preflight(capsys, *argv)


def test_malformed_tokenizer(tmp_path, capsys):
    bad = tmp_path / "tokenizer.model"
    bad.write_text("aGVsbG8= 0\nnot-base64!! x\n")
    assert "line" in run_preflight(capsys, "--model.tokenizer_path", str(bad))


def test_tokenizer_larger_than_model_vocab(tmp_path, capsys):
    big = write_tokenizer(tmp_path / "tokenizer.model", n_base=4000)
    err = run_preflight(capsys, "--model.tokenizer_path", str(big))
    assert "has 4256 tokens but model flavor debugmodel has vocab_size 4096" in err


def test_model_vocab_size_override_must_hold_the_tokenizer(capsys):
    err = run_preflight(capsys, "--model.vocab_size", "4000")
    assert "has 4096 tokens but --model.vocab_size is 4000" in err
    assert "set --model.vocab_size to at least 4096" in err


def test_a_real_tokenizer_with_a_small_model_via_vocab_size(tmp_path, capsys):
    big = write_tokenizer(tmp_path / "tokenizer.model", n_base=4000)
    assert preflight(["--model.tokenizer_path", str(big), "--model.vocab_size", "4256"]) == 0


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--model.n_heads", "7"], "model.dim (256) must be divisible by model.n_heads (7)"),
        (["--model.n_kv_heads", "3"], "model.n_heads (16) must be divisible by model.n_kv_heads"),
        (["--model.dim", "-8"], "--model.dim must be positive (0 = the flavor's); got -8"),
        (["--model.dim", "80"], "head_dim = dim / n_heads = 5 must be even"),
    ],
)
def test_bad_model_shapes_are_one_line(capsys, argv, expected):
    err = run_preflight(capsys, *argv)
    assert expected in err


def test_bad_validation_data_is_one_line(capsys):
    err = run_preflight(capsys, "--validation.enable", "--validation.dataset", "/nope/val.jsonl")
    assert err == "error: validation dataset path not found: /nope/val.jsonl\n"


def test_empty_dataset_file(tmp_path, capsys):
    empty = tmp_path / "data.jsonl"
    empty.write_text("")
    assert "empty" in run_preflight(capsys, "--training.dataset", str(empty))


def test_valid_job_passes(capsys):
    assert preflight(["--job.config_file", str(ROOT / "train_configs/debug_model.toml")]) == 0


def run_train_sh(*args, env=None):
    env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(
        [str(ROOT / "run_train.sh"), *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_run_train_sh_rejects_bad_ngpu_and_keys():
    result = run_train_sh(env={"NGPU": "two"})
    assert result.returncode == 2 and "NGPU must be a positive integer" in result.stderr
    result = run_train_sh("--training.stepz", "3")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: unknown config key 'training.stepz' (command line); did you mean 'training.steps'?"
    )


def test_run_train_sh_trains_the_debug_model(tmp_path):
    result = run_train_sh(
        "--training.steps", "3", "--training.seq_len", "64", "--job.dump_folder", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "training done: 3 steps" in result.stdout + result.stderr
    assert list((tmp_path / "tb").glob("*/events.out.tfevents.*"))


@pytest.mark.parametrize(
    "world, argv, expected",
    [
        (4, ["--parallelism.tensor_parallel_degree", "3"], "not divisible by the product 3"),
        (
            8,
            ["--parallelism.tensor_parallel_degree", "8"],
            "tensor_parallel_degree=8 must divide n_heads=16 and n_kv_heads=4",
        ),
        (
            2,
            ["--parallelism.tensor_parallel_degree", "2", "--training.seq_len", "63"],
            "must divide training.seq_len=63",
        ),
        (
            2,
            [
                "--parallelism.tensor_parallel_degree",
                "2",
                "--parallelism.enable_async_tensor_parallel",
            ],
            "needs tensor_parallel_degree > 1, --compile.enable and CUDA",
        ),
        (
            2,
            ["--training.global_batch_size", "12", "--training.local_batch_size", "4"],
            "multiple of",
        ),
        (
            2,
            [
                "--parallelism.context_parallel_degree",
                "2",
                "--parallelism.context_parallel_rotate_method",
                "alltoall",
                "--compile.enable",
            ],
            "alltoall hangs with --compile.enable; use allgather",
        ),
    ],
)
def test_parallel_layout_errors(capsys, monkeypatch, world, argv, expected):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    assert expected in run_preflight(capsys, *argv)


def test_seed_checkpoint_never_overwritten(tmp_path, capsys):
    (tmp_path / "checkpoint" / "step-0").mkdir(parents=True)
    err = run_preflight(
        capsys, "--job.dump_folder", str(tmp_path), "--checkpoint.create_seed_checkpoint"
    )
    assert "already exists" in err
    err = run_preflight(capsys, "--checkpoint.initial_load_path", str(tmp_path / "nope"))
    assert f"--checkpoint.initial_load_path {tmp_path / 'nope'} does not exist" in err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--parallelism.pipeline_parallel_schedule", "Interleaved1f1b"], "did you mean"),
        (["--parallelism.pipeline_parallel_microbatch_size", "3"], "not divisible"),
        (
            ["--parallelism.pipeline_parallel_schedule", "ZBVZeroBubble", "--compile.enable"],
            "does not support for compiled stages",
        ),
        (["--parallelism.pipeline_parallel_schedule", "CSV"], "pipeline_parallel_schedule_csv"),
        (["--training.local_batch_size", "1"], "1F1B needs at least 2 microbatches"),
    ],
)
def test_pipeline_errors(capsys, monkeypatch, argv, expected):
    monkeypatch.setenv("WORLD_SIZE", "2")
    err = run_preflight(capsys, "--parallelism.pipeline_parallel_degree", "2", *argv)
    assert expected in err


def test_context_parallel_needs_seq_len_divisible_by_2cp(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    err = run_preflight(
        capsys, "--parallelism.context_parallel_degree", "4", "--training.seq_len", "36"
    )
    assert "seq_len" in err and "8" in err


@pytest.mark.parametrize(
    "content, problem",
    [
        ("this is not json\n", "line 1: not valid JSON: Expecting value (column 1)"),
        ('\n{"text": "a"\n', "line 2: not valid JSON: Expecting ',' delimiter (column 13)"),
        ('["a", "b"]\n', 'line 1: a JSON array, not an object like {"text": "..."}'),
        ('{"text": 3}\n', "line 1: field 'text' holds a JSON number, not text"),
    ],
)
def test_garbage_jsonl_is_refused_naming_file_and_line(tmp_path, capsys, content, problem):
    path = tmp_path / "garbage.jsonl"
    path.write_text(content)
    err = run_preflight(capsys, "--training.dataset", str(path))
    assert err == f"error: dataset file {path}, {problem}\n"


def test_json_document_over_many_lines_is_left_to_the_loader(tmp_path, capsys):
    path = tmp_path / "docs.json"
    path.write_text('[\n  {"text": "a"},\n  {"text": "b"}\n]\n')
    assert preflight(["--training.dataset", str(path)]) == 0, capsys.readouterr().err


def test_run_train_sh_help_prints_once_with_the_config_values():
    result = run_train_sh("--training.seed", "5", "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert out.count("usage: ") == 1 and "[rank" not in out + result.stderr
    toml = ROOT / "train_configs" / "debug_model.toml"
    assert f"--training.steps 100 (default 10000, from {toml})" in out
    assert "--training.seed 5 (default 0, from command line)" in out
    assert "--training.max_norm (1.0)" in out  # the TOML sets the default value: shown as such
