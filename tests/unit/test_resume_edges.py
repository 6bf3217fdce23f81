"""Resuming as a new user would: stale step folders, a branch from an earlier load_step, a changed
training.steps or batch, nothing left to train, a wrong initial_load_path, HF weights, a warmup
longer than the run."""

import logging
import shutil
from pathlib import Path

import pytest

from tests.unit.test_hf import ARGS, needs_safetensors, random_model, write_hf_dir
from torchtitan.checkpoint import is_complete
from torchtitan.checkpoint.hf_load import load_hf_weights
from torchtitan.config import parse_args
from torchtitan.models.llama3 import hf
from torchtitan.preflight import check_job
from torchtitan.preflight import main as preflight
from torchtitan.run_metrics import read_metrics
from torchtitan.train import Trainer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

TINY = [
    "--training.seq_len=16",
    "--training.local_batch_size=1",
    "--lr_scheduler.warmup_steps=2",
    "--lr_scheduler.min_lr_ratio=0.1",
    "--optimizer.lr=3e-3",
    "--metrics.log_freq=1",
    "--metrics.enable_tensorboard=false",
]
CHECKPOINTED = ["--checkpoint.enable", "--checkpoint.interval=2"]


@pytest.fixture(autouse=True)
def info_logs(caplog):
    caplog.set_level(logging.INFO, logger="torchtitan")


def train(folder: Path, *extra: str) -> Trainer:
    trainer = Trainer(parse_args([*TINY, f"--job.dump_folder={folder}", *extra]))
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory) -> Path:
    """A 6-step run with step-2, step-4 and step-6 checkpoints."""
    folder = tmp_path_factory.mktemp("six")
    train(folder, "--training.steps=6", *CHECKPOINTED)
    return folder


def copy_run(six_steps: Path, tmp_path: Path) -> Path:
    shutil.copytree(six_steps, tmp_path / "run")
    return tmp_path / "run"


def metrics_of_launch(folder: Path, index: int) -> dict[int, dict]:
    return read_metrics(sorted((folder / "metrics").glob("*.jsonl"))[index]).rows


# --------------------------------------------------------------------------- stale step folders


def drop_metadata(step: Path) -> None:
    (step / ".metadata").unlink()  # a crash before DCP wrote the metadata


def truncate_a_shard(step: Path) -> None:
    shard = next(step.glob("*.distcp"))
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)


@pytest.mark.parametrize("damage", [drop_metadata, truncate_a_shard])
def test_a_stale_latest_step_is_moved_aside_and_the_save_goes_on(
    damage, six_steps, tmp_path, caplog
):
    run = copy_run(six_steps, tmp_path)
    damage(run / "checkpoint" / "step-6")
    planted = {p.name: p.stat().st_size for p in (run / "checkpoint" / "step-6").iterdir()}

    trainer = train(run, "--training.steps=6", *CHECKPOINTED)
    assert "continuing after step 4" in caplog.text
    assert trainer.step == 6
    folder = run / "checkpoint"
    assert is_complete(folder / "step-6")
    (aside,) = folder.glob("step-6.stale-*")  # the stale content is preserved, untouched
    assert {p.name: p.stat().st_size for p in aside.iterdir()} == planted
    assert (
        "step-6 already existed" in caplog.text and f"moved it aside to {aside.name}" in caplog.text
    )

    # Steps 5-6 were redone exactly; the joined metrics take the later launch's.
    first, again = metrics_of_launch(run, 0), metrics_of_launch(run, 1)
    assert sorted(again) == [5, 6]
    for step in (5, 6):
        assert again[step]["loss"] == pytest.approx(first[step]["loss"], rel=1e-6)
    assert read_metrics(run).repeated == [5, 6]

    # The next resume is a plain one: the aside folder is not warned about or loaded.
    caplog.clear()
    train(run, "--training.steps=6", *CHECKPOINTED)
    assert "continuing after step 6" in caplog.text
    assert "incomplete" not in caplog.text


def test_resuming_from_an_earlier_load_step_sets_the_later_branch_aside_before_keep_k(
    tmp_path, caplog
):
    """Steps 10-40 kept to 3; resumed from step-20 and saved 25, 30: keep-k never deletes the
    branch point, the old branch's step-30/40 are preserved aside, the next resume loads 30."""
    small = ["--model.dim=64", "--model.n_layers=1", "--model.n_heads=4", "--model.n_kv_heads=2"]
    keep3 = [*small, "--checkpoint.enable", "--checkpoint.keep_latest_k=3"]
    run, folder = tmp_path / "run", tmp_path / "run" / "checkpoint"
    train(run, "--training.steps=40", "--checkpoint.interval=10", *keep3)
    assert sorted(p.name for p in folder.iterdir()) == ["step-20", "step-30", "step-40"]
    old_branch = {step: (folder / f"step-{step}").stat().st_ino for step in (30, 40)}

    caplog.clear()
    resumed = train(
        run, "--training.steps=30", "--checkpoint.interval=5", "--checkpoint.load_step=20", *keep3
    )
    assert resumed.step == 30 and "continuing after step 20" in caplog.text
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    warnings = [w for w in warnings if "(--checkpoint.load_step)" in w]
    assert len(warnings) == 1 and warnings[0].startswith(
        "resumed from step-20 (--checkpoint.load_step) while later steps existed: moved "
        "step-30, step-40 aside to step-30.stale-"
    )
    assert "deleting" not in caplog.text
    names = sorted(p.name for p in folder.iterdir())
    assert names[:3] == ["step-20", "step-25", "step-30"] and len(names) == 5
    for step, name in zip((30, 40), names[3:]):  # the old branch, renamed untouched
        assert name.startswith(f"step-{step}.stale-") and name in warnings[0]
        assert (folder / name).stat().st_ino == old_branch[step] and is_complete(folder / name)
    assert (folder / "step-30").stat().st_ino != old_branch[30]

    caplog.clear()
    again = train(run, "--training.steps=30", *keep3)  # an automatic resume
    assert again.step == 30 and f"resumed from {folder / 'step-30'} (" in caplog.text


# --------------------------------------------------------------------------- the lr schedule


def test_a_longer_run_follows_the_new_lr_schedule_from_the_first_resumed_step(
    six_steps, tmp_path, caplog
):
    """6 steps, resumed with training.steps=10: step 7 on use exactly the lr an uninterrupted
    10-step run uses (the optimizer's, set at load, and the logged one)."""
    train(tmp_path / "straight", "--training.steps=10")
    expected = metrics_of_launch(tmp_path / "straight", 0)
    assert expected[7]["lr"] == pytest.approx(3e-3 * (0.1 + 0.9 * 3 / 8))

    run = copy_run(six_steps, tmp_path)
    argv = [*TINY, f"--job.dump_folder={run}", "--training.steps=10", *CHECKPOINTED]
    resumed = Trainer(parse_args(argv))
    try:
        assert resumed.lr_schedulers[0].last_epoch == 6
        assert resumed.optimizers[0].param_groups[0]["lr"] == expected[7]["lr"]
        resumed.train()
    finally:
        resumed.close()
    assert (
        "training.steps changed 6 -> 10 since the checkpoint: the lr schedule follows the new "
        "settings from step 7 (lr 1.31e-03)"
    ) in caplog.text
    after = metrics_of_launch(run, 1)
    assert sorted(after) == [7, 8, 9, 10]
    for step in after:
        assert after[step]["lr"] == expected[step]["lr"]  # exactly


# --------------------------------------------------------------------------- nothing to train


def test_nothing_to_train_says_so_and_writes_no_metrics(six_steps, tmp_path, caplog):
    run = copy_run(six_steps, tmp_path)
    metrics_before = sorted((run / "metrics").iterdir())
    trainer = train(
        run,
        "--training.steps=4",
        "--training.local_batch_size=2",
        "--lr_scheduler.warmup_steps=8",
        "--checkpoint.enable",
    )
    assert trainer.step == 6
    assert (
        "checkpoint step-6 is at or past training.steps=4: nothing to train; raise "
        "--training.steps to continue"
    ) in caplog.text
    assert sorted((run / "metrics").iterdir()) == metrics_before  # no empty file
    # Nothing trains: no line about how the lr schedule or the batch would continue.
    assert "since the checkpoint" not in caplog.text and "lr schedule" not in caplog.text
    assert "lr_scheduler.warmup_steps=8 is longer than training.steps=4" in caplog.text


# --------------------------------------------------------------------------- what to load


def preflight_error(capsys, *argv: str) -> str:
    assert preflight(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err.strip()


def test_initial_load_path_names_what_it_is_and_the_step_to_use(six_steps, tmp_path, capsys):
    option = "--checkpoint.initial_load_path"
    ckpt = six_steps / "checkpoint"
    err = preflight_error(capsys, option, str(ckpt))
    assert err == (
        f"error: {option} {ckpt} is a checkpoint folder, not a step; use {ckpt / 'step-6'} "
        "(steps: 2, 4, 6)"
    )
    err = preflight_error(capsys, option, str(six_steps))
    assert err == (
        f"error: {option} {six_steps} is a run folder, not a checkpoint; use "
        f"{ckpt / 'step-6'} (steps: 2, 4, 6)"
    )
    assert preflight_error(capsys, option, str(tmp_path / "nope")) == (
        f"error: {option} {tmp_path / 'nope'} does not exist"
    )
    (tmp_path / "empty").mkdir()
    assert preflight_error(capsys, option, str(tmp_path / "empty")).endswith(
        "is not a complete DCP checkpoint (its .metadata file is missing)"
    )
    assert preflight([option, str(ckpt / "step-4")]) == 0


def test_warmup_longer_than_the_run_is_a_warning():
    job = check_job(parse_args(["--training.steps=5", "--lr_scheduler.warmup_steps=20"]), 1)
    assert job.warnings == [
        "lr_scheduler.warmup_steps=20 is longer than training.steps=5: the lr never reaches "
        "its peak (it ends at 25% of --optimizer.lr)"
    ]
    assert not check_job(
        parse_args(["--training.steps=5", "--lr_scheduler.warmup_steps=5"]), 1
    ).warnings


def test_loading_hf_weights_logs_one_line(tmp_path, caplog):
    needs_safetensors()
    args = ARGS["rope_scaling"]
    model = random_model(args)
    path = write_hf_dir(tmp_path / "hf", model.state_dict(), args)
    load_hf_weights(random_model(args, seed=1), path)
    lines = [r.getMessage() for r in caplog.records if "Hugging Face" in r.getMessage()]
    assert len(lines) == 1, lines
    tensors = len(hf.expected_shapes(args))
    assert lines[0].startswith(f"loaded {tensors} tensors from the Hugging Face checkpoint")
    assert str(path) in lines[0] and lines[0].endswith("s")
