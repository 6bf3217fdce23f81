"""Folders and disk space: preflight refuses a dump folder it cannot write and a disk that cannot
hold one checkpoint, warns when it cannot hold what keep_latest_k keeps; a save that runs out of
space ends the run in one line, removes its partial folder and leaves the previous step intact.
No disk is filled: ``shutil.disk_usage`` and DCP's file writer are monkeypatched."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch.distributed.checkpoint.filesystem as dcp_files

from tests.unit.test_checkpoint import Job
from torchtitan import runtime, train
from torchtitan.checkpoint import CheckpointError, complete_steps, is_complete, load_safely
from torchtitan.checkpoint.space import (
    checkpoint_bytes,
    count_saves,
    folder_bytes,
    gib,
    nth_save,
)
from torchtitan.config import parse_args
from torchtitan.models.llama3 import model_args_from_config
from torchtitan.preflight import check_job
from torchtitan.preflight import main as preflight

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

GIB = 1 << 30
DEBUG_CHECKPOINT = checkpoint_bytes(model_args_from_config(parse_args([]).model, 2048).num_params())
Usage = namedtuple("Usage", "total used free")


@pytest.fixture
def free_space(monkeypatch):
    """Set the free bytes every disk reports."""

    def set_free(free: int) -> None:
        monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(1 << 50, 0, int(free)))

    return set_free


def one_line_error(capsys, *argv: str) -> str:
    assert preflight(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err.strip()


# --------------------------------------------------------------------------- folders


def test_an_unwritable_dump_folder_is_one_line(tmp_path, capsys):
    err = one_line_error(capsys, "--job.dump_folder", "/proc/x")
    assert err.startswith("error: --job.dump_folder /proc/x cannot be created or written: ")
    assert err.endswith("choose a folder you can write")

    in_the_way = tmp_path / "file"
    in_the_way.write_text("")
    err = one_line_error(capsys, "--job.dump_folder", str(in_the_way / "run"))
    assert err == (
        f"error: --job.dump_folder {in_the_way / 'run'}: {in_the_way} is a file, not a folder; "
        "choose another folder"
    )
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "ckpt").write_text("")  # the checkpoint folder's name is taken by a file
    argv = ["--job.dump_folder", str(tmp_path / "run"), "--checkpoint.folder", "ckpt"]
    assert preflight(argv) == 0  # checkpointing off: the folder is not used
    err = one_line_error(capsys, *argv, "--checkpoint.enable")
    assert err.startswith(f"error: --checkpoint.folder {tmp_path / 'run' / 'ckpt'}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "run"]  # no probe left


# --------------------------------------------------------------------------- before training


def test_saves_are_counted_from_the_resumed_step():
    assert count_saves(0, 10, 2) == 5 and count_saves(0, 9, 2) == 5  # ... and the last, 9
    assert count_saves(6, 10, 5) == 1 and count_saves(10, 10, 5) == 0 and count_saves(0, 3, 5) == 1
    assert [nth_save(3, 9, 2, n) for n in (1, 2, 3, 4)] == [4, 6, 8, 9]


def test_preflight_refuses_a_disk_that_cannot_hold_one_checkpoint(tmp_path, capsys, free_space):
    free_space(DEBUG_CHECKPOINT // 2)
    argv = ["--job.dump_folder", str(tmp_path), "--checkpoint.enable"]
    err = one_line_error(capsys, *argv)
    assert err == (
        f"error: {tmp_path / 'checkpoint'} has {gib(DEBUG_CHECKPOINT // 2)} free on its disk, but "
        f"one checkpoint of this model and optimizer needs about {gib(DEBUG_CHECKPOINT)}; free "
        "space, or set --job.dump_folder to a larger disk"
    )
    assert preflight(argv[:2]) == 0  # without checkpoints nothing is needed


def test_preflight_warns_when_the_kept_checkpoints_will_not_fit(tmp_path, free_space):
    free_space(2.5 * DEBUG_CHECKPOINT)  # two fit
    base = ["--job.dump_folder", str(tmp_path), "--checkpoint.enable", "--training.steps=10"]
    base.append("--lr_scheduler.warmup_steps=2")
    job = check_job(parse_args([*base, "--checkpoint.interval=2"]), 1)
    assert job.warnings == [
        f"checkpoints will fill the disk: {tmp_path / 'checkpoint'} has "
        f"{gib(2.5 * DEBUG_CHECKPOINT)} free, this run saves 5 checkpoint(s) of about "
        f"{gib(DEBUG_CHECKPOINT)} and keeps every one, so the save at step 6 would "
        "fail; set --checkpoint.keep_latest_k 1, raise --checkpoint.interval, free space, or set "
        "--job.dump_folder to a larger disk"
    ]
    assert not check_job(parse_args([*base, "--checkpoint.interval=5"]), 1).warnings
    keep1 = ["--checkpoint.interval=2", "--checkpoint.keep_latest_k=1"]  # 2 on disk at most
    assert not check_job(parse_args([*base, *keep1]), 1).warnings
    keep3 = check_job(
        parse_args([*base, "--checkpoint.interval=2", "--checkpoint.keep_latest_k=3"]), 1
    )
    assert (
        "keeps 3 (one more while saving), so the save at step 6 would fail; set "
        in (keep3.warnings[0])
        and "--checkpoint.keep_latest_k 1, free space" in keep3.warnings[0]
    )


def test_a_resumed_run_counts_its_remaining_saves_and_the_steps_keep_k_deletes(
    tmp_path, free_space
):
    for step in (2, 4, 6):  # an earlier run's complete steps
        (tmp_path / "checkpoint" / f"step-{step}").mkdir(parents=True)
        (tmp_path / "checkpoint" / f"step-{step}" / ".metadata").write_bytes(b"")
    base = ["--job.dump_folder", str(tmp_path), "--checkpoint.enable", "--training.steps=10"]
    base += ["--checkpoint.interval=2", "--lr_scheduler.warmup_steps=2"]  # saves 8 and 10
    free_space(1.5 * DEBUG_CHECKPOINT)
    (warning,) = check_job(parse_args(base), 1).warnings
    assert "saves 2 checkpoint(s)" in warning and "the save at step 10 would fail; set " in warning
    assert "--checkpoint.keep_latest_k 3, raise" in warning  # 3 kept + 1 being written fit
    assert not check_job(parse_args([*base, "--checkpoint.keep_latest_k=3"]), 1).warnings
    free_space(0.5 * DEBUG_CHECKPOINT)  # steps 2 and 4 are deleted before step 8 is written
    assert not check_job(parse_args([*base, "--checkpoint.keep_latest_k=1"]), 1).warnings
    with pytest.raises(CheckpointError) as refused:  # keeping all, step 8 does not fit
        check_job(parse_args(base), 1)
    assert str(refused.value).endswith(
        "; set --checkpoint.keep_latest_k 2, free space, or set --job.dump_folder to a larger disk"
    )
    assert not check_job(parse_args([*base, "--checkpoint.keep_latest_k=2"]), 1).warnings


# --------------------------------------------------------------------------- a save that fails


class FullDisk:
    """DCP's writes into a folder named ``failing`` write a little, then fail as on a full disk,
    which from then on reports ``free_after`` bytes free; ``listings``: what the checkpoint
    folder held at each write."""

    def __init__(self, monkeypatch, failing: str, free_after: int = 1 << 20, code=errno.ENOSPC):
        self.failing, self.free_after, self.full, self.code = failing, free_after, False, code
        self.listings: list[list[str]] = []
        self.write_item = dcp_files._write_item
        monkeypatch.setattr(dcp_files, "_write_item", self.write)
        monkeypatch.setattr(shutil, "disk_usage", self.usage)

    def usage(self, path) -> Usage:
        return Usage(1 << 50, 0, self.free_after if self.full else 1 << 40)

    def write(self, transforms, stream, *args, **kwargs):
        folder = Path(stream.name).parent
        self.listings.append(sorted(p.name for p in folder.parent.iterdir()))
        if folder.name == self.failing:
            stream.write(b"\0" * 4096)
            self.full = self.code == errno.ENOSPC
            raise OSError(self.code, os.strerror(self.code))
        return self.write_item(transforms, stream, *args, **kwargs)


@pytest.mark.parametrize("async_mode", ["disabled", "async"])
def test_a_full_disk_removes_the_partial_save_and_keeps_the_previous_step(
    tmp_path, monkeypatch, async_mode
):
    job = Job(seed=0)
    manager = job.manager(tmp_path, async_mode=async_mode)
    job.train_and_save(manager, 1)
    FullDisk(monkeypatch, "step-2.tmp")
    with pytest.raises(CheckpointError) as error:
        job.train_and_save(manager, 1)
        manager.close()  # async: the failure is found when the save is finished
    folder = tmp_path / "checkpoint"
    line = str(error.value)
    assert line.startswith(
        f"checkpoint step-2 could not be written: the disk of {folder} is full ("
    )
    size = folder_bytes(folder / "step-1")
    assert "\n" not in line and line.endswith(
        f"(1.0 MiB free once its partial folder was removed; one checkpoint needs about "
        f"{size / 2**20:.1f} MiB); step-1 is intact; raise --checkpoint.interval, free space, or "
        "set --job.dump_folder to a larger disk"
    )
    assert sorted(p.name for p in folder.iterdir()) == ["step-1"]  # no step-2.tmp
    load_safely({"model": manager.states["model"]}, folder / "step-1")  # intact


def test_another_failed_write_keeps_its_own_error(tmp_path, monkeypatch):
    job = Job(seed=0)
    manager = job.manager(tmp_path)
    job.train_and_save(manager, 1)
    FullDisk(monkeypatch, "step-2.tmp", code=errno.EIO)
    with pytest.raises(CheckpointError) as error:
        job.train_and_save(manager, 1)
    assert str(error.value) == (
        "checkpoint step-2 could not be written: rank 0: OSError: [Errno 5] Input/output error; "
        "its partial folder was removed, step-1 is intact"
    )
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["step-1"]


def test_keep_latest_k_deletes_older_steps_before_the_first_save(tmp_path, monkeypatch):
    """An earlier run kept every step; this one keeps 1: steps 1-2 go before step 4 is written,
    so the disk never holds more than k + 1."""
    job = Job(seed=0)
    job.train_and_save(job.manager(tmp_path), 3)
    disk = FullDisk(monkeypatch, "no such step")
    job.train_and_save(job.manager(tmp_path, keep_latest_k=1), 1)
    assert disk.listings[0] == ["step-3", "step-4.tmp"]
    assert complete_steps(tmp_path / "checkpoint") == [4]


def test_a_full_disk_stops_training_in_one_line_with_rc_2(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(runtime, "setup_logging", lambda rank: None)  # keep caplog's handler
    caplog.set_level(logging.INFO, logger="torchtitan")
    argv = [
        f"--job.dump_folder={tmp_path}",
        "--training.seq_len=16",
        "--training.local_batch_size=1",
        "--training.steps=4",
        "--model.n_layers=1",
        "--metrics.enable_tensorboard=false",
        "--checkpoint.enable",
        "--checkpoint.interval=2",
    ]
    step2 = checkpoint_bytes(model_args_from_config(parse_args(argv).model, 16).num_params())
    FullDisk(monkeypatch, "step-4.tmp", free_after=int(1.5 * step2))  # step-2 + this: keep 1
    assert train.main(argv) == 2
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name == "torchtitan"  # not DCP's own (not shown)
    ]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: checkpoint step-4 could not be written: the disk of {tmp_path / 'checkpoint'} "
        "is full ("
    )
    assert (
        "step-2 is intact; set --checkpoint.keep_latest_k 1, raise --checkpoint.interval"
        in (errors[0])
    )
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["step-2"]
    assert is_complete(tmp_path / "checkpoint" / "step-2")
