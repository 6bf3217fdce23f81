"""Validation in one process: the loss of the held-out batches (checked by hand), the same every
time, no effect on training or on the training loader, its schedule, its metrics and its checks."""

import json
import logging
import math

import pytest
import torch
import torch.nn.functional as F

from torchtitan.config import ConfigError, parse_args
from torchtitan.data import DataError, build_dataloader
from torchtitan.data.splits import validation_dataset
from torchtitan.parallel.pipeline_eval import stage_owners
from torchtitan.train import Trainer

TINY = [
    "--training.seq_len=64",
    "--training.local_batch_size=4",
    "--training.steps=3",
    "--lr_scheduler.warmup_steps=2",
    "--optimizer.lr=3e-3",
    "--metrics.log_freq=1",
    "--metrics.enable_tensorboard=false",
]
VALIDATE = ["--validation.enable", "--validation.freq=2", "--validation.steps=3"]


def make_trainer(tmp_path, *extra) -> Trainer:
    return Trainer(parse_args([*TINY, f"--job.dump_folder={tmp_path}", *extra]))


def loss_by_hand(trainer: Trainer, spec: str, batches: int) -> float:
    """Mean token loss of the first validation batches: plain forward + cross-entropy."""
    loader = build_dataloader(spec, trainer.tokenizer, 64, 4, 0, 1, infinite=False)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for _, (inputs, labels) in zip(range(batches), loader):
            logits = trainer.model(inputs)
            total += F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
            tokens += labels.numel()
    return float(total) / tokens


def test_loss_is_the_mean_over_the_batches_and_repeats(tmp_path):
    trainer = make_trainer(tmp_path, *VALIDATE)
    before = trainer.dataloader.state_dict()
    first, second = trainer.validator.run(), trainer.validator.run()
    assert first["val_loss"] == second["val_loss"]
    assert first["val_loss"] == pytest.approx(
        loss_by_hand(trainer, "sample@validation", 3), rel=1e-6
    )
    assert first["val_perplexity"] == pytest.approx(math.exp(first["val_loss"]))
    assert (first["val_batches"], first["val_tokens"]) == (3, 3 * 4 * 64)
    assert trainer.dataloader.state_dict() == before
    assert trainer.model.training and all(p.grad is None for p in trainer.model.parameters())
    trainer.close()


def test_the_data_is_read_once_and_kept(tmp_path, monkeypatch, caplog):
    """The start-up check and the first validation read the validation data in one pass; later
    validations read none of it and give the identical loss."""
    trainer = make_trainer(tmp_path, *VALIDATE)
    dataset = trainer.validator.loader.dataset

    def read_again(*args):
        raise AssertionError("the validation data was read again")

    # A new pass over the data would start here: the first validation continues the pass that
    # the start-up check began.
    monkeypatch.setattr(dataset, "positioned_samples", read_again)
    monkeypatch.setattr(dataset.documents, "read", read_again)
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        first, second = trainer.validator.run(), trainer.validator.run()
    assert second["val_loss"] == first["val_loss"]
    assert first["val_batches"] == second["val_batches"] == 3
    (kept,) = [r.getMessage() for r in caplog.records if "kept in host memory" in r.getMessage()]
    assert "3 batches" in kept
    kept_bytes = sum(w.nbytes + p.nbytes for w, p in trainer.validator.batches.windows)
    # batches x samples x (window tokens + input positions) x int32
    assert kept_bytes == 3 * 4 * (65 + 64) * 4
    assert trainer.validator.loader.num_workers == 0
    trainer.close()


def test_whole_set_with_minus_one_steps(tmp_path):
    """-1 steps: every whole batch of the set once (9 windows of 65 tokens: 2 batches of 4)."""
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(json.dumps({"text": "the quick brown fox jumps " * 52}) + "\n")
    trainer = make_trainer(
        tmp_path,
        "--validation.enable",
        "--validation.steps=-1",
        f"--validation.dataset={held_out}",
    )
    windows = sum(
        1 for _ in build_dataloader(str(held_out), trainer.tokenizer, 64, 1, 0, 1, infinite=False)
    )
    result = trainer.validator.run()
    assert windows >= 8 and result["val_batches"] == windows // 4
    assert result["val_loss"] == pytest.approx(loss_by_hand(trainer, str(held_out), 99), rel=1e-6)
    trainer.close()


def test_training_is_unchanged_and_metrics_are_written(tmp_path):
    plain = make_trainer(tmp_path / "plain")
    expected = plain.train()
    plain.close()
    validated = make_trainer(tmp_path / "val", *VALIDATE)
    assert validated.train() == expected
    validated.close()
    (jsonl,) = (tmp_path / "val" / "metrics").glob("*.jsonl")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    val_rows = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in val_rows] == [2, 3]  # every freq steps and at the last step
    for row in val_rows:
        assert row["val_perplexity"] == pytest.approx(math.exp(row["val_loss"]))
        assert row["val_seconds"] > 0 and "loss" not in row
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]


def test_validation_data_smaller_than_a_batch_fails_at_start(tmp_path):
    tiny = tmp_path / "tiny.jsonl"
    tiny.write_text(json.dumps({"text": "only a few words"}) + "\n")
    with pytest.raises(DataError, match="holds less than one batch"):
        make_trainer(tmp_path, "--validation.enable", f"--validation.dataset={tiny}")


def test_a_bad_validation_record_is_named_as_the_validation_data(tmp_path):
    """Preflight reads the first record only; the loader's error still says which data it is."""
    bad = tmp_path / "val.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n" + '{"text": "cut\n')
    with pytest.raises(DataError) as error:
        make_trainer(tmp_path, "--validation.enable", f"--validation.dataset={bad}")
    assert str(error.value).startswith(f"validation dataset file {bad}, line 2: not valid JSON")


@pytest.mark.parametrize(
    "training, expected",
    [
        ("sample", "sample@validation"),
        ("c4", "c4@validation"),
        ("hf:org/name:cfg", "hf:org/name:cfg@validation"),
        ("c4@train", "c4@validation"),
    ],
)
def test_default_validation_dataset_is_the_validation_split(training, expected):
    cfg = parse_args([f"--training.dataset={training}"])
    assert validation_dataset(cfg) == expected


def test_local_training_data_needs_an_explicit_validation_dataset(tmp_path):
    cfg = parse_args([f"--training.dataset={tmp_path}/train.jsonl"])
    with pytest.raises(DataError, match="set --validation.dataset"):
        validation_dataset(cfg)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--validation.freq=0"], "--validation.freq must be positive"),
        (["--validation.steps=0"], "--validation.steps must be positive or -1"),
        (["--validation.local_batch_size=0"], "--validation.local_batch_size must be positive"),
    ],
)
def test_bad_validation_options(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(argv)


@pytest.mark.parametrize(
    "schedule, owners",
    [
        ("1F1B", {0: 0, 1: 1}),
        ("Interleaved1F1B", {0: 0, 1: 1, 2: 0, 3: 1}),
        ("ZBVZeroBubble", {0: 0, 1: 1, 2: 1, 3: 0}),
    ],
)
def test_pipeline_stage_owners_follow_the_schedule(schedule, owners):
    assert stage_owners(schedule, pp=2, num_stages=len(owners)) == owners
