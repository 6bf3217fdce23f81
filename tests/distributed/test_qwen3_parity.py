"""Qwen3 under the shared composition: each layout, from one seed checkpoint, reproduces the
single-process curve (fp32, CPU/gloo), as tests/distributed/test_parity.py does for Llama.

MoE rows also compare the expert load imbalance of every step with the single-process run: the
loads are counted per rank and summed over the data/context-parallel ranks before the selection
bias moves, so a layout that lost or double-counted tokens, or let a rank's bias drift, shows
here (and in the loss, since the bias steers the routing).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.distributed.launch import (
    ROOT,
    TINY_JOB,
    assert_curves_match,
    curves,
    from_seed,
    read_metrics,
    run_trainer,
    with_slow,
)
from tests.distributed.test_parity import RTOL

MOE = ("--model.name=qwen3", "--model.flavor=debugmodel_moe")
# The sequence-level aux loss too: its gradient enters each layer through its output, weighted
# by the step's micro-batches (accumulation) and pipeline microbatches. (Not under CP, where a
# rank sees part of each sequence and the loss is computed over that part.)
MOE_AUX = (*MOE, "--model.moe_aux_loss_coeff=0.01")
DENSE_TIED = ("--model.name=qwen3", "--model.flavor=debugmodel_tied")

LAYOUTS = {
    # name: (model, processes, overrides)
    # Expert parallel: two ranks split each layer's 8 experts and FSDP shards each half over the
    # other two; compiled blocks break their graph around the token exchange (inside it fp32
    # experts take the masked path), full AC recomputes the exchange, and the loads are counted
    # once; two micro-batches per step weight the aux loss.
    "moe_aux_ep2_fsdp4_accum2_compile_full_ac": (
        MOE_AUX,
        4,
        [
            "--training.local_batch_size=1",
            "--parallelism.expert_parallel_degree=2",
            "--compile.enable",
            "--activation_checkpoint.mode=full",
        ],
    ),
    # Under TP the MoE layer runs on each rank's sequence shard; the TP pair is the EP group.
    "moe_ep2_tp2_selective_op": (
        MOE,
        4,
        [
            "--training.local_batch_size=4",
            "--parallelism.tensor_parallel_degree=2",
            "--parallelism.expert_parallel_degree=2",
            "--activation_checkpoint.mode=selective",
        ],
    ),
    # The aux loss's gradient enters each stage's layers through their outputs, weighted by the
    # pipeline microbatches.
    "moe_aux_pp2_ep2": (
        MOE_AUX,
        4,
        [
            "--training.local_batch_size=4",
            "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.pipeline_parallel_microbatch_size=2",
            "--parallelism.expert_parallel_degree=2",
        ],
    ),
    # The CP pair is the EP group: each rank routes its part of every sequence.
    "moe_cp2_ep2_selective_op": (
        MOE,
        4,
        [
            "--training.local_batch_size=4",
            "--parallelism.context_parallel_degree=2",
            "--parallelism.expert_parallel_degree=2",
            "--activation_checkpoint.mode=selective",
        ],
    ),
    # The tied table: FSDP keeps the embedding and head in the root group, TP re-ties the
    # sharded parameter after its styles replaced it.
    "tied_fsdp2_tp2": (
        DENSE_TIED,
        4,
        ["--training.local_batch_size=4", "--parallelism.tensor_parallel_degree=2"],
    ),
}


def _train_one_process(args: list[str], folder, timeout: int = 300) -> None:
    subprocess.run(
        [sys.executable, "-m", "torchtitan.train", *args, f"--job.dump_folder={folder}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=timeout,
    )


def _seed(model: list[str], tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("qwen3_seed")
    _train_one_process(
        [*model, "--checkpoint.create_seed_checkpoint", "--training.seq_len=64"], folder
    )
    return str(folder / "checkpoint" / "step-0")


def _reference(model: list[str], seed: str, tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_reference")
    args = [*model, *TINY_JOB, "--training.local_batch_size=8"]
    _train_one_process([*args, f"--checkpoint.initial_load_path={seed}"], folder)
    return folder


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """``get(model) -> (seed checkpoint, reference dump folder)``: one seed per flavor and one
    single-process reference per model arguments, each made once, when first asked for."""
    seeds, made = {}, {}

    def get(model: tuple[str, ...]) -> tuple[str, object]:
        flavor = model[:2]
        if flavor not in seeds:
            seeds[flavor] = _seed(list(flavor), tmp_path_factory)
        if model not in made:
            made[model] = (seeds[flavor], _reference(list(model), seeds[flavor], tmp_path_factory))
        return made[model]

    return get


def metric(folder, name: str) -> list[float]:
    return [r[name] for r in read_metrics(folder) if name in r]


def imbalance(folder) -> list[float]:
    return metric(folder, "moe_load_imbalance")


# In the slow tier (make test-all): EP x FSDP is also run by the DeepSeek-V3 rows and compiled MoE
# by tests/unit/test_moe.py.
# In the slow tier: EP under TP is also run by DeepSeek-V3's tp2_ep2 row.
SLOW = {"moe_aux_ep2_fsdp4_accum2_compile_full_ac", "moe_ep2_tp2_selective_op"}


@pytest.mark.parametrize("layout", with_slow(LAYOUTS, SLOW))
def test_qwen3_layout_matches_single_process(layout, references, tmp_path):
    model, nproc, overrides = LAYOUTS[layout]
    seed, reference = references(model)
    out = run_trainer(nproc, [*model, *TINY_JOB, *overrides, *from_seed(seed, tmp_path)])
    assert "training done" in out, out[-2000:]
    if "--parallelism.expert_parallel_degree=2" in overrides:
        assert "ep=2" in out
    assert_curves_match(curves(tmp_path), curves(reference), points=6, rtol=RTOL)
    if model[:2] == MOE:
        assert "dropless" in out
        assert imbalance(tmp_path) == pytest.approx(imbalance(reference), rel=1e-6)
    if model == MOE_AUX:
        aux = metric(tmp_path, "moe_aux_loss")
        assert len(aux) == 6 and aux == pytest.approx(metric(reference, "moe_aux_loss"), rel=1e-5)
