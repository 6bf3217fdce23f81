"""When ``--parallelism.fsdp_all_gather copy_engines`` is refused before launch, where ``auto``
chooses it, and the memory it holds outside the caching allocator (the FSDP plumbing:
tests/distributed/)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

from torchtitan.config import ConfigError, parse_args
from torchtitan.models.llama3.args import model_args_for_job
from torchtitan.parallel import copy_engine_all_gather as ce
from torchtitan.preflight import check_parallelism


@pytest.fixture
def on_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_no_problem_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ce.copy_engine_problem(fsdp_degree=16, tp=8, gpus_per_node=1) is None


def test_the_shard_group_must_fit_one_node(on_cuda):
    assert ce.copy_engine_problem(fsdp_degree=4, tp=1, gpus_per_node=4) is None
    assert ce.copy_engine_problem(fsdp_degree=4, tp=2, gpus_per_node=8) is None  # ranks 0,2,4,6
    problem = ce.copy_engine_problem(fsdp_degree=4, tp=2, gpus_per_node=4)
    assert "spans 7 ranks (4 shards, 2 apart)" in problem and "4 GPUs" in problem
    assert "nccl" in problem


def test_not_with_pipeline_parallel(on_cuda):
    problem = ce.copy_engine_problem(fsdp_degree=2, tp=1, gpus_per_node=4, pp=2)
    assert "pipeline parallel" in problem


def test_a_torch_without_fsdps_custom_all_gather_is_named(on_cuda, monkeypatch):
    monkeypatch.delattr(FSDPModule, "set_custom_all_gather")
    problem = ce.copy_engine_problem(fsdp_degree=2, tp=1, gpus_per_node=2)
    assert torch.__version__ in problem and "set_custom_all_gather" in problem


def test_preflight_refuses_a_shard_group_across_nodes(on_cuda, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    cfg = parse_args(
        [
            "--parallelism.data_parallel_shard_degree=8",
            "--parallelism.fsdp_all_gather=copy_engines",
        ]
    )
    with pytest.raises(ConfigError, match="copies between GPUs of one node"):
        check_parallelism(cfg, model_args_for_job(cfg), world_size=8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    check_parallelism(cfg, model_args_for_job(cfg), world_size=8)


@pytest.fixture
def node_of_4(on_cuda, monkeypatch):
    """Four visible GPUs that all reach each other."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda a, b: True)


def chosen(choice="auto", fsdp_degree=4, tp=1, cp=1, pp=1, gpus_per_node=4):
    return ce.uses_copy_engines(choice, fsdp_degree, tp, cp, pp, gpus_per_node)


def test_auto_is_the_default_and_takes_the_copy_engines_for_fsdp_alone(node_of_4):
    assert parse_args([]).parallelism.fsdp_all_gather == "auto"
    assert chosen() == (True, "auto: FSDP alone, within one node")
    assert chosen(fsdp_degree=2)[0]  # HSDP's shard groups of 2, or FSDP2


@pytest.mark.parametrize(
    "layout, why",
    [
        ({"tp": 2, "fsdp_degree": 2}, "NCCL's with TP"),
        ({"cp": 2}, "NCCL's with CP"),
        ({"pp": 2, "tp": 2, "fsdp_degree": 1}, "nothing to gather"),
        ({"pp": 2, "fsdp_degree": 2}, "NCCL's with PP"),
        ({"fsdp_degree": 8}, "spans more than one node"),
    ],
)
def test_auto_keeps_nccl_elsewhere_and_says_why(node_of_4, layout, why):
    use, reason = chosen(**layout)
    assert not use and why in reason


def test_auto_keeps_nccl_when_the_gpus_cannot_reach_each_other(node_of_4, monkeypatch):
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda a, b: (a, b) != (3, 1))
    assert chosen() == (False, "auto: this node's GPUs cannot all map each other's memory")
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda a, b: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # one GPU visible per rank
    assert not chosen()[0]


def test_auto_without_cuda_and_the_explicit_choices(node_of_4, monkeypatch):
    assert chosen("nccl") == (False, "--parallelism.fsdp_all_gather nccl")
    assert chosen("copy_engines", tp=2) == (True, "--parallelism.fsdp_all_gather copy_engines")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert chosen() == (False, "auto: nothing to gather on GPUs")
