"""When ``--experimental.fsdp_copy_engine_all_gather`` and the other experimental switches are
refused before launch (the FSDP plumbing: tests/distributed/)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

from torchtitan.config import parse_args
from torchtitan.experimental import copy_engine_all_gather as ce
from torchtitan.parallel.compose import experimental_problem
from torchtitan.parallel.dims import ParallelDims


@pytest.fixture
def on_cuda(monkeypatch):
    """Four visible CUDA GPUs that all reach each other."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda a, b: True)


def test_no_problem_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ce.copy_engine_problem(fsdp_degree=16, tp=8, gpus_per_node=1) is None


def test_the_shard_group_must_fit_one_node(on_cuda):
    assert ce.copy_engine_problem(fsdp_degree=4, tp=1, gpus_per_node=4) is None
    problem = ce.copy_engine_problem(fsdp_degree=4, tp=2, gpus_per_node=4)
    assert "spans 7 ranks (4 shards, 2 apart)" in problem and "4 GPUs" in problem


def test_not_with_pipeline_parallel(on_cuda):
    problem = ce.copy_engine_problem(fsdp_degree=2, tp=1, gpus_per_node=4, pp=2)
    assert "pipeline parallel" in problem


def test_a_torch_without_fsdps_custom_all_gather_is_named(on_cuda, monkeypatch):
    monkeypatch.delattr(FSDPModule, "set_custom_all_gather")
    problem = ce.copy_engine_problem(fsdp_degree=2, tp=1, gpus_per_node=2)
    assert torch.__version__ in problem and "set_custom_all_gather" in problem


def test_gpus_that_cannot_reach_each_other_are_refused(on_cuda, monkeypatch):
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda a, b: (a, b) != (3, 1))
    assert "map each other's memory" in ce.copy_engine_problem(4, 1, gpus_per_node=4)


def problem_of(argv: list[str], world_size: int) -> str | None:
    cfg = parse_args(argv)
    return experimental_problem(cfg, ParallelDims.from_config(cfg.parallelism, world_size))


def test_preflight_refuses_a_shard_group_across_nodes(on_cuda, monkeypatch):
    argv = ["--experimental.fsdp_copy_engine_all_gather=true"]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert "copies between GPUs of one node" in problem_of(argv, world_size=4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert problem_of(argv, world_size=4) is None
    assert problem_of([], world_size=4) is None  # off by default: nothing to check


def test_the_fused_swiglu_needs_tensorwise_float8_without_tp():
    on = ["--experimental.float8_fused_swiglu=true"]
    assert "needs --float8.enable" in problem_of(on, world_size=1)
    f8 = [*on, "--float8.enable", "--float8.emulate"]
    assert problem_of(f8, world_size=1) is None
    assert "recipe tensorwise" in problem_of([*f8, "--float8.recipe=rowwise"], world_size=1)
    assert "under TP" in problem_of([*f8, "--parallelism.tensor_parallel_degree=2"], 2)


def test_every_experimental_switch_is_off_by_default():
    x = parse_args([]).experimental
    assert not any(vars(x).values()), vars(x)
