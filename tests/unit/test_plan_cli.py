"""python -m torchtitan.plan and the preflight memory check (no GPU needed)."""

import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from torchtitan.config import ConfigError, parse_args
from torchtitan.config.parse import take_flags
from torchtitan.plan import main as plan_main
from torchtitan.planning.command import planned_config, run_train_command
from torchtitan.planning.hardware import make_hardware
from torchtitan.planning.layout import Layout, Workload
from torchtitan.planning.search import search
from torchtitan.preflight import main as preflight

ROOT = Path(__file__).resolve().parents[2]
CONFIG_8B = str(ROOT / "train_configs/llama3_8b.toml")


def run_plan(capsys, *argv) -> str:
    assert plan_main(list(argv)) == 0
    return capsys.readouterr().out


def commands(output: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in output.splitlines() if ": NGPU=" in line]


def test_table_and_commands_that_the_trainer_parses(capsys):
    out = run_plan(capsys, "--job.config_file", CONFIG_8B, "--gpus", "4", "--card", "H200")
    assert "tokens/s/GPU" in out and "peak memory" in out and "MFU" in out
    rows = [line.split() for line in out.splitlines() if line[:2] in ("1 ", "2 ")]
    cmds = commands(out)
    assert len(cmds) == 5 and cmds[0].startswith(f"NGPU=4 CONFIG_FILE={CONFIG_8B} ./run_train.sh")
    args = shlex.split(cmds[0].split("./run_train.sh", 1)[1])
    cfg = parse_args(["--job.config_file", CONFIG_8B, *args])
    assert cfg.compile.enable and cfg.compile.loss
    assert Layout.from_config(cfg, 4).describe() == rows[0][1]


def test_float8_plan_names_its_linears_and_keeps_float8_in_the_commands(capsys):
    out = run_plan(capsys, "--job.config_file", CONFIG_8B, "--gpus", "4", "--card", "H200")
    float8_out = run_plan(
        capsys, "--job.config_file", CONFIG_8B, "--gpus", "4", "--card", "H200", "--float8.enable"
    )
    assert "float8 tensorwise: wq, wk, wv, wo, w1, w2, w3 in float8; output in bf16" in float8_out
    assert "float8" not in out
    assert all("--float8.enable" in cmd for cmd in commands(float8_out))

    def top_speed(text: str) -> int:
        row = next(line for line in text.splitlines() if line.startswith("1 "))
        return int(row.split()[-2].replace(",", ""))

    assert top_speed(float8_out) > 1.1 * top_speed(out)


def test_overrides_and_nodes_reach_the_command(capsys):
    out = run_plan(
        capsys, "--gpus", "2", "--nodes", "2", "--card", "A100", "--training.seq_len", "1024"
    )
    cmd = commands(out)[0]
    assert cmd.startswith("NGPU=2 NNODES=2 ./run_train.sh") and "--training.seq_len 1024" in cmd
    cfg = parse_args(shlex.split(cmd.split("./run_train.sh", 1)[1]))
    assert Layout.from_config(cfg, 4).world_size == 4


def test_explain_lists_rejections(capsys):
    out = run_plan(capsys, "--gpus", "8", "--card", "H100", "--top", "2", "--explain")
    assert "rejected layouts:" in out
    assert "tensor_parallel_degree=8 must divide n_heads=16 and n_kv_heads=4" in out
    assert len(commands(out)) == 2


def test_custom_card_and_nothing_fits_exits_1(capsys):
    card = ["--memory-gib", "16", "--tflops", "100", "--nvlink-gbps", "50", "--network-gbps", "10"]
    assert plan_main(["--job.config_file", CONFIG_8B, "--gpus", "1", *card]) == 1
    captured = capsys.readouterr()
    assert "nothing fits" in captured.out and "custom" in captured.out
    assert captured.err.count("\n") == 1 and captured.err.startswith(
        "error: no layout fits in 13.5 GiB per GPU: the closest, "
    )
    assert captured.err.rstrip().endswith(
        "; use more GPUs (--gpus, --nodes) or a card with more memory, or lower "
        "--training.seq_len or --training.global_batch_size"
    )


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--card", "H100"], "give the number of GPUs per node: --gpus N"),
        (["--gpus", "0", "--card", "H100"], "--gpus and --nodes must be positive"),
        (["--gpus", "two", "--card", "H100"], "--gpus expects int, got 'two'"),
        (["--gpus", "2", "--card", "H1000"], "unknown card 'H1000'"),
        (["--gpus", "2"], "give --card"),
        (["--gpus", "2", "--tflops", "100"], "--memory-gib, --nvlink-gbps, --network-gbps"),
        (["--gpus", "2", "--card", "H100", "--memory-gib", "-1"], "--memory-gib must be positive"),
        (["--gpu", "2"], "unknown option --gpu; did you mean --gpus?"),
        (["--card", "H100", "--gpus"], "--gpus needs a value"),
        (["--gpus=2", "--card", "H100", "--explain=maybe"], "--explain expects bool, got 'maybe'"),
        (
            ["--gpus", "2", "--card", "H100", "--training.stepz", "3"],
            "did you mean 'training.steps'",
        ),
        (["--gpus", "3", "--card", "H100", "--top", "0"], "--top must be positive"),
    ],
)
def test_bad_arguments_are_one_line(capsys, argv, expected):
    assert plan_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and expected in err, err


def test_flags_are_taken_out_and_the_rest_is_left_for_the_config():
    """The one flag splitter of torchtitan.plan and torchtitan.generate."""
    flags = {"gpus": int, "explain": bool, "prompt": str}
    argv = ["--gpus", "2", "--training.steps", "3", "--explain", "--prompt", "--x", "-h", "--help"]
    assert take_flags(argv, flags) == (
        {"gpus": 2, "explain": True, "prompt": "--x"},
        ["--training.steps", "3", "-h", "--help"],
    )
    assert take_flags(["--gpus=4", "--explain=false", "--prompt="], flags)[0] == {
        "gpus": 4,
        "explain": False,
        "prompt": "",
    }
    with pytest.raises(ConfigError, match=r"^unknown option --promt; did you mean --prompt\?$"):
        take_flags(["--promt", "hi"], flags)
    with pytest.raises(ConfigError, match=r"^unknown option --zzz; see --help$"):
        take_flags(["--zzz"], flags)


# ---------------------------------------------------------------- preflight memory check


@pytest.fixture
def fake_h100(monkeypatch):
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=80 * 10**9)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setenv("WORLD_SIZE", "4")


JOB_8B = ["--job.config_file", CONFIG_8B, "--training.dataset", "sample"]


def test_preflight_stops_a_job_that_clearly_does_not_fit(capsys, fake_h100):
    assert preflight(JOB_8B) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("memory plan: ~")
    err = captured.err
    assert err.startswith("error: the job needs ~") and err.count("\n") == 1, err
    assert "largest: activations" in err and "fits (~" in err and "skip_memory_check" in err
    suggested = err.split("); ", 1)[1].split(" fits (~")[0]
    assert preflight(JOB_8B + shlex.split(suggested)) == 0


def test_preflight_memory_check_can_be_skipped_and_passes_jobs_that_fit(capsys, fake_h100):
    assert preflight([*JOB_8B, "--job.skip_memory_check"]) == 0
    fitting = ["--compile.enable", "--compile.loss", "--activation_checkpoint.mode", "selective"]
    assert preflight(JOB_8B + fitting) == 0
    assert "memory plan: ~" in capsys.readouterr().out


def test_preflight_on_cpu_prints_no_estimate(capsys):
    assert preflight(["--job.config_file", str(ROOT / "train_configs/debug_model.toml")]) == 0
    assert "memory plan" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "config_args",
    [
        [],
        [
            "--parallelism.pipeline_parallel_degree",
            "2",
            "--parallelism.pipeline_parallel_split_points",
            "3",
        ],
        ["--training.global_batch_size", "32", "--activation_checkpoint.selective_ac_option", "2"],
    ],
)
def test_every_planned_command_parses_back_to_its_layout(config_args):
    """The printed command line, parsed by the trainer, runs exactly the planned job."""
    cfg = parse_args(config_args)
    hw = make_hardware(4, card="H100")
    plan = search(cfg, Workload.from_config(cfg).with_(compile=True, compile_loss=True), hw)
    assert plan.fits
    for candidate in plan.fits[:: max(1, len(plan.fits) // 40)]:  # a spread of 40 layouts
        job = planned_config(cfg, candidate.layout, plan.global_batch)
        cmd = run_train_command(job, "", hw)
        parsed = parse_args(shlex.split(cmd.split("./run_train.sh", 1)[1]))
        assert Layout.from_config(parsed, 4) == Layout.from_config(job, 4), cmd
        assert parsed.training.global_batch_size in (-1, plan.global_batch)
