"""Replica groups through torchft on CPU: two torchrun jobs of two gloo ranks each (FSDP inside a
group), a lighthouse on localhost, from the session's seed checkpoint.

* no failure: the loss curve is the single-process one (to which HSDP 2 x 2 is held by the
  parity suite) and the groups' weights are bitwise equal after every step;
* a group SIGKILLed during a step's exchange: the other runs the step again alone (1 live
  replica), the group restarted by torchrun rejoins with weights bitwise equal to the survivor's;
  SIGKILLed again between an exchange and its commit: the survivor commits that step (it holds
  both groups' gradients) and continues alone, and the restarted group heals from it again;
* LocalSGD and DiLoCo, sync_every 5: weights equal right after a synchronization and apart in
  between, the outer step as the algorithm defines it, 1/5 of the synchronous exchange.

The trainers record their weights through ``TORCHTITAN_FT_PROBE`` (``fault_tolerance/probe.py``).
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import (
    TINY_JOB,
    from_seed,
    kill_tree,
    read_metrics,
    start,
    wait_all,
    with_slow,
)
from tests.distributed.test_parity import RTOL
from tests.distributed.test_qwen3_parity import MOE, _reference, _seed

LIGHTHOUSE = Path(sys.executable).with_name("torchft_lighthouse")
PARAMETERS_PER_RANK = 6_622_464 // 2  # the debug model, FSDP over the 2 ranks of a group


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def start_lighthouse(tmp_path: Path, min_replicas: int):
    port = free_port()
    cmd = [str(LIGHTHOUSE), f"--min_replicas={min_replicas}", f"--bind=[::]:{port}"]
    proc = start([*cmd, "--join_timeout_ms=20000"], tmp_path / "lighthouse.log")
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("localhost", port), timeout=1).close()
            return proc, f"http://localhost:{port}"
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, "no lighthouse"
            time.sleep(0.1)


def run_groups(tmp_path, seed, args, min_replicas=2, faults=("", ""), timeout=240, restarts=1):
    """Two replica groups of two ranks; -> each group's dump folder and the probe folder."""
    lighthouse, address = start_lighthouse(tmp_path, min_replicas)
    probe = tmp_path / "probe"
    dumps = [tmp_path / f"replica_{i}" for i in range(2)]
    logs = [tmp_path / f"replica_{i}.log" for i in range(2)]
    procs = [lighthouse]
    try:
        for i in range(2):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            cmd += ["--nproc_per_node=2", f"--max-restarts={restarts}", "-m", "torchtitan.train"]
            cmd += [*args, *from_seed(seed, dumps[i]), "--fault_tolerance.enable"]
            cmd += ["--fault_tolerance.group_size=2", f"--fault_tolerance.replica_id={i}"]
            cmd += [
                f"--fault_tolerance.lighthouse={address}",
                "--fault_tolerance.timeout_seconds=20",
            ]
            env = {"TORCHTITAN_FT_PROBE": str(probe), "TORCHTITAN_FAULT": faults[i]}
            procs.append(start(cmd, logs[i], env=env))
        wait_all(procs[1:], logs, timeout=timeout)
    finally:
        kill_tree(lighthouse)
    return dumps, probe, [log.read_text() for log in logs]


def probes(probe: Path, replica: int, point: str) -> dict[int, dict]:
    """step -> what rank 0 of the group recorded at ``point``."""
    folder = probe / f"replica_{replica}" / "rank_0"
    return {int(f.name[:5]): torch.load(f) for f in sorted(folder.glob(f"*_{point}.pt"))}


def digests(probe: Path, replica: int) -> dict[int, str]:
    return {step: p["digest"] for step, p in probes(probe, replica, "step").items()}


def loss_curve(dump: Path) -> list[float]:
    return [row["loss"] for row in read_metrics(dump) if "loss" in row]


def test_replica_groups_train_like_one_job(seed_checkpoint, reference_curves, tmp_path):
    args = [*TINY_JOB, "--training.local_batch_size=2"]
    dumps, probe, outputs = run_groups(tmp_path, seed_checkpoint, args)
    assert "2 replica groups" not in outputs[0]  # no change of the live count was logged
    for dump in dumps:
        assert loss_curve(dump) == pytest.approx(reference_curves[0], rel=RTOL)
    rows = read_metrics(dumps[0])
    assert [r["live_replicas"] for r in rows] == [2] * 6
    assert [r["tokens_trained"] for r in rows] == [8 * 64] * 6
    # Every step: this rank's gradient shards and the loss crossed the groups.
    assert {r["replica_allreduce_elements"] for r in rows} == {PARAMETERS_PER_RANK + 1}
    assert digests(probe, 0) == digests(probe, 1) and len(digests(probe, 0)) == 6


@pytest.mark.parametrize(
    "layout",
    with_slow(["ep2", "fsdp2"], {"fsdp2"}),
)
def test_moe_groups_agree_on_expert_biases(tmp_path_factory, tmp_path, layout):
    """Qwen3-MoE with its per-expert selection bias, experts split over the group's 2 ranks
    (EP2, their own FSDP modules) or sharded with the blocks: the expert gradients and the
    expert loads are averaged over the groups before each commit, so the groups' parameters and
    buffers (the biases) stay bitwise equal and the loss curve is the single-process one."""
    seed = _seed(list(MOE), tmp_path_factory)
    reference = _reference(list(MOE), seed, tmp_path_factory)
    args = [*MOE, *TINY_JOB, "--training.local_batch_size=2"]
    if layout == "ep2":
        args.append("--parallelism.expert_parallel_degree=2")
    dumps, probe, _ = run_groups(tmp_path, seed, args)
    assert digests(probe, 0) == digests(probe, 1) and len(digests(probe, 0)) == 6
    expected = loss_curve(reference)
    for dump in dumps:
        assert loss_curve(dump) == pytest.approx(expected, rel=RTOL)


# Group 1's rank 0 dies twice: SIGKILLed at the start of step 3 (attempt 0, once it joined the
# step's quorum) and after step 7's exchange, before its commit vote (attempt 1). Whichever group
# starts first waits at step 1, so the other joins by step 2; each restarted group waits before
# it rejoins, so the survivor runs a step alone first; the survivor waits at steps 5 and 9, so
# the restarted group is back before it ends.
START = "delay:rank=0:step=1:seconds=6:attempt=0"
GROUP_1 = [
    START,
    "kill:rank=0:step=3:attempt=0",
    "delay:step=0:at=join:seconds=6:attempt=1",
    "kill:rank=0:step=7:at=commit:attempt=1",
    "delay:step=0:at=join:seconds=6:attempt=2",
]
SURVIVOR = [START, "delay:rank=0:step=5:seconds=18", "delay:rank=0:step=9:seconds=18"]


def test_killed_group_drops_out_and_rejoins_with_the_live_weights(seed_checkpoint, tmp_path):
    """Killed in the exchange (step 3), group 1 leaves group 0 a failed step: it does not
    commit and group 0 runs it again alone. Killed after the exchange (step 7), it leaves group 0
    a complete step (both groups' gradients), which group 0 commits and continues alone from.
    Each time torchrun restarts group 1, which heals from group 0: its weights (parameters and
    buffers) equal group 0's bitwise at every step both record."""
    steps = [a for a in TINY_JOB if not a.startswith("--training.steps")]
    args = [*steps, "--training.steps=10", "--training.local_batch_size=2"]
    faults = (";".join(SURVIVOR), ";".join(GROUP_1))
    dumps, probe, outputs = run_groups(tmp_path, seed_checkpoint, args, 1, faults, restarts=2)
    survivor, rejoined, log = digests(probe, 0), digests(probe, 1), outputs[0]
    first = min(survivor)  # 2 when group 1 trained step 1 alone and group 0 healed from it
    assert first <= 2 and sorted(survivor) == list(range(first, 11)), sorted(survivor)
    for step in set(rejoined) & set(survivor):
        assert rejoined[step] == survivor[step], f"step {step}: weights differ"
    rows = {r["step"]: r for r in read_metrics(dumps[0])}
    # The kill in the exchange: step 3 is run again by group 0 alone.
    assert "1 of 2 replica groups live from step 3" in log, log[-3000:]
    assert rows[3]["live_replicas"] == 1 and 3 not in rejoined, sorted(rejoined)
    back = min(step for step in rejoined if step > 3)
    assert f"2 of 2 replica groups live from step {back}" in log and back <= 6, back
    # The kill after the exchange: step 7 commits with both groups, step 8 runs alone.
    assert rows[7]["live_replicas"] == 2 and rows[7]["tokens_trained"] == 8 * 64, rows[7]
    assert rows[7]["replica_allreduce_elements"] == PARAMETERS_PER_RANK + 1, rows[7]
    assert "1 of 2 replica groups live from step 8" in log, log[-3000:]
    assert rows[8]["live_replicas"] == 1 and {8, 9}.isdisjoint(rejoined), sorted(rejoined)
    assert set(range(back, 7)) | {10} <= set(rejoined), sorted(rejoined)
    assert rows[10]["live_replicas"] == 2, rows[10]
    print(f"steps 3 and 8 took {rows[3]['step_seconds']:.1f}s and {rows[8]['step_seconds']:.1f}s")


def outer_step(start, inner, lr=0.7, momentum=0.9, buffer=None):
    """DiLoCo's outer step, by its definition: the mean pseudo-gradient (start - inner weights)
    taken by SGD with Nesterov momentum from ``start``; -> (weights, momentum buffer)."""
    delta = sum(start - weights for weights in inner) / len(inner)
    buffer = delta if buffer is None else momentum * buffer + delta
    return start - lr * (delta + momentum * buffer), buffer


@pytest.mark.slow
@pytest.mark.parametrize("method", ["local_sgd", "diloco"])
def test_semi_sync_meets_every_five_steps(seed_checkpoint, tmp_path, method):
    steps = [a for a in TINY_JOB if not a.startswith("--training.steps")]
    args = [*steps, "--training.steps=10", "--training.local_batch_size=2"]
    args += [f"--fault_tolerance.semi_sync={method}", "--fault_tolerance.sync_every=5"]
    dumps, probe, _ = run_groups(tmp_path, seed_checkpoint, args)
    step_digests = [digests(probe, i) for i in range(2)]
    for step in range(1, 11):
        same = step_digests[0][step] == step_digests[1][step]
        assert same == (step % 5 == 0), f"step {step}: equal weights {same}"
    inner = [probes(probe, i, "inner") for i in range(2)]
    after = [probes(probe, i, "step") for i in range(2)]
    weights = probes(probe, 0, "start")[0]["tensor"]
    buffer = None
    for sync in (5, 10):
        local = [inner[i][sync]["tensor"] for i in range(2)]
        if method == "local_sgd":
            weights = sum(local) / 2
        else:
            weights, buffer = outer_step(weights, local, buffer=buffer)
        for i in range(2):
            torch.testing.assert_close(after[i][sync]["tensor"], weights, rtol=1e-5, atol=1e-7)
    exchanged = [r["replica_allreduce_elements"] for r in read_metrics(dumps[0])]
    assert exchanged == [0, 0, 0, 0, PARAMETERS_PER_RANK] * 2
    # The synchronous run exchanges PARAMETERS_PER_RANK + 1 elements every step.
    assert sum(exchanged) / (10 * (PARAMETERS_PER_RANK + 1)) == pytest.approx(1 / 5, rel=1e-5)
    for dump in dumps:
        losses = loss_curve(dump)
        assert losses[-1] < losses[0], losses
