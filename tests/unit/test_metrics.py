"""torchtitan/metrics.py against values computed by hand: peak FLOPs, MFU, tokens/s over a
logging window, the ETA and the JSONL record of each log step."""

import json
import logging
import math
import types

import pytest
import torch

from torchtitan import metrics
from torchtitan.metrics import MetricsLogger, StepStats, format_duration, peak_flops

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "device_name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("Tesla V100-SXM2-16GB", None),  # not in the table: MFU is omitted
    ],
)
def test_peak_flops_looks_up_the_device_name(monkeypatch, device_name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: device_name)
    assert peak_flops(torch.device("cuda", 0)) == peak


def test_peak_flops_is_unknown_off_cuda():
    assert peak_flops(CPU) is None


@pytest.mark.parametrize(
    "seconds, text",
    [(0, "0m00s"), (59.9, "0m59s"), (61, "1m01s"), (3600, "1h00m"), (3725, "1h02m")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


class Clock:
    """Stands in for time.perf_counter inside torchtitan.metrics."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock(10.0)
    monkeypatch.setattr(metrics, "time", types.SimpleNamespace(perf_counter=fake))
    return fake


def stats(step: int, tokens: int = 1000, data_seconds: float = 0.0) -> StepStats:
    return StepStats(step, 2.5, 0.75, 1e-4, tokens, data_seconds, data_windows=8 * step)


def make_logger(tmp_path, monkeypatch, peak=None, **kw) -> MetricsLogger:
    monkeypatch.setattr(metrics, "peak_flops", lambda device: peak)
    options = dict(device=CPU, flops_per_token=6_000_000_000, total_steps=102, log_freq=4)
    options.update(dump_folder=tmp_path, run_id="r1", enable_tensorboard=False, **kw)
    return MetricsLogger(**options)


def test_logs_step_1_every_log_freq_and_the_last_step(tmp_path, monkeypatch):
    m = make_logger(tmp_path, monkeypatch, enabled=False)
    assert [s for s in range(1, 103) if m.should_log(s)] == [1, *range(4, 101, 4), 102]


def test_window_metrics_and_mfu(tmp_path, monkeypatch, clock, caplog):
    m = make_logger(tmp_path, monkeypatch, peak=24e12)
    m.record(stats(1))  # logged; the next window starts at t=10
    for step, data_seconds in [(2, 0.25), (3, 0.5)]:
        assert m.record(stats(step, data_seconds=data_seconds)) is None
    clock.now = 13.0  # 3 steps in 3 s
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        got = m.record(stats(4, data_seconds=0.75))
    # 3 x 1000 tokens / 3 s = 1000 tokens/s; x 6e9 FLOPs per token = 6 TFLOP/s = 25% of 24e12
    expected = {
        "loss": 2.5,
        "grad_norm": 0.75,
        "lr": 1e-4,
        "tokens_per_second": 1000.0,
        "tflops": 6.0,
        "data_loading_pct": 50.0,  # (0.25 + 0.5 + 0.75) s of 3 s
        "step_seconds": 1.0,
        "data_windows": 32,
        "mfu_pct": 25.0,
    }
    assert got == pytest.approx(expected)
    line = caplog.records[-1].getMessage()
    # 98 steps left at 1 s each
    for part in [
        "step   4/102",
        "tps 1,000",
        "tflops 6.00",
        "mfu 25.0%",
        "data 50.0%",
        "eta 1m38s",
    ]:
        assert part in line
    m.close()


def test_window_restarts_after_each_log_step(tmp_path, monkeypatch, clock):
    m = make_logger(tmp_path, monkeypatch, enabled=False)
    for step in (1, 2, 3, 4):
        m.record(stats(step))
    for step in (5, 6, 7):
        assert m.record(stats(step, tokens=400)) is None
    clock.now = 14.0  # steps 5..8: 4 x 400 tokens in 4 s; steps 2..4 no longer count
    got = m.record(stats(8, tokens=400))
    assert got["tokens_per_second"] == pytest.approx(400.0)
    assert got["step_seconds"] == pytest.approx(1.0)
    assert "mfu_pct" not in got  # no known peak on CPU


def test_jsonl_record_per_log_step(tmp_path, monkeypatch, clock):
    m = make_logger(tmp_path, monkeypatch)
    clock.now = 12.0
    m.record(stats(1, tokens=500))
    m.record(stats(2, tokens=300))
    m.record(stats(3, tokens=300))
    clock.now = 14.0
    m.record(stats(4, tokens=400))
    m.close()
    lines = (tmp_path / "metrics" / "r1.jsonl").read_text().splitlines()
    assert len(lines) == 2  # steps 1 and 4 only
    records = [json.loads(line) for line in lines]
    assert records[0]["step"] == 1 and records[1]["step"] == 4
    # steps 2..4: 1000 tokens in 2 s
    assert records[1] == pytest.approx(
        {
            "step": 4,
            "loss": 2.5,
            "grad_norm": 0.75,
            "lr": 1e-4,
            "tokens_per_second": 500.0,
            "tflops": 3.0,
            "data_loading_pct": 0.0,
            "step_seconds": 2.0 / 3,
            "data_windows": 32,
        }
    )


def test_disabled_rank_writes_nothing(tmp_path, monkeypatch):
    m = make_logger(tmp_path, monkeypatch, enabled=False)
    assert m.record(stats(1)) is not None
    m.close()
    assert not (tmp_path / "metrics").exists()


def validation_metrics(seconds: float) -> dict[str, float]:
    loss = 3.0
    return {
        "val_loss": loss,
        "val_perplexity": math.exp(loss),
        "val_tokens": 2048,
        "val_batches": 4,
        "val_seconds": seconds,
    }


def test_validation_time_is_not_training_time(tmp_path, monkeypatch, clock, caplog):
    caplog.set_level(logging.INFO, logger="torchtitan")
    m = make_logger(tmp_path, monkeypatch)
    m.record(stats(1))
    clock.now = 13.0  # step 2 trained for 1 s, then 2 s of validation
    m.record_validation(2, validation_metrics(seconds=2.0))
    m.record(stats(2))
    m.record(stats(3))
    clock.now = 15.0  # steps 2..4: 3 x 1000 tokens in 5 s, of which 2 s validated
    got = m.record(stats(4))
    assert got["tokens_per_second"] == pytest.approx(1000.0)
    m.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics" / "r1.jsonl").read_text().splitlines()]
    assert rows[1] == pytest.approx({"step": 2, **validation_metrics(2.0)})
    line = next(r.getMessage() for r in caplog.records if "val_loss" in r.getMessage())
    for part in ["validation at step   2/102", "val_loss   3.0000", "val_perplexity 20.09"]:
        assert part in line
    assert "4 batches, 2,048 tokens" in line and "took 2.0s" in line


def test_validation_goes_to_tensorboard(tmp_path, monkeypatch):
    scalars = []
    m = make_logger(tmp_path, monkeypatch)
    m._writer = types.SimpleNamespace(add_scalar=lambda *a: scalars.append(a), close=lambda: None)
    m.record_validation(5, validation_metrics(seconds=1.0))
    m.close()
    assert ("val_loss", 3.0, 5) in scalars and ("val_perplexity", math.exp(3.0), 5) in scalars
