"""Fault-tolerance mistakes end in one line before any process group (in-process, no ranks)."""

from __future__ import annotations

import socket

import pytest

from torchtitan.config import ConfigError, parse_args
from torchtitan.preflight import check_job

FT = ["--fault_tolerance.enable", "--fault_tolerance.group_size=2"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def error_of(args: list[str], world_size: int = 1) -> str:
    with pytest.raises(ConfigError) as caught:
        check_job(parse_args(["--training.seq_len=64", *args]), world_size)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--fault_tolerance.semi_sync=diloco"], "semi_sync diloco needs --fault_tolerance.enable"),
        ([*FT, "--fault_tolerance.replica_id=2"], "replica_id 2 is outside the 2 replica groups"),
        ([*FT, "--fault_tolerance.semi_sync=diloco", "--fault_tolerance.fragments=3"], "divide"),
        ([*FT, "--fault_tolerance.lighthouse=localhost:1"], "must look like http://HOST:PORT"),
    ],
)
def test_config_mistakes(args, expected):
    assert expected in error_of(args)


def test_unreachable_lighthouse_names_how_to_start_one():
    address = f"http://localhost:{closed_port()}"
    message = error_of([*FT, f"--fault_tolerance.lighthouse={address}"])
    assert f"the torchft lighthouse at {address} did not answer within 10 s" in message
    assert "torchft_lighthouse --min_replicas 1" in message


def test_combinations_torchft_cannot_run(monkeypatch):
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    replicate = [*FT, "--parallelism.data_parallel_replicate_degree=2"]
    assert "set it to 1" in error_of(replicate, world_size=2)
    pipeline = [
        *FT,
        "--fault_tolerance.semi_sync=local_sgd",
        "--parallelism.pipeline_parallel_degree=2",
    ]
    assert "not run with pipeline parallelism" in error_of(pipeline, world_size=2)
    moe = [*FT, "--fault_tolerance.semi_sync=diloco", "--model.name=qwen3"]
    moe += ["--model.flavor=debugmodel_moe"]
    assert "MoE selection biases (buffers) would drift apart" in error_of(moe)
    assert "would drift apart" not in error_of([*moe, "--model.moe_balance_bias=false"])
    assert "needs the torchft lighthouse" in error_of(FT)
