"""Float8 training (emulated, tensorwise) on CPU/gloo: parity, bitwise resume, checkpoints.

Dynamic float8 scales are computed per tensor, so a layout reproduces the single-process run only
if every tensor it scales holds the same values: each weight whole (FSDP's float8 all-gather
all-reduces the shards' amax; the precomputed scales reduce over the whole (dp, tp) mesh) and
each activation for the same samples. The runs therefore train one 64-token window per forward
(local batch 1): the single-process reference accumulates the 8 windows of a step one by one, as
each data-parallel rank does its share.

Tolerance. The curves start equal to fp32 rounding (FSDP2: loss <= 1.1e-7), but float8 casts
amplify it: a value within fp32 rounding of an e4m3 rounding boundary lands on the other side,
moving by an ulp of e4m3 (2^-3 to 2^-4 of itself) instead of 1e-7. Measured over the 4 steps
(torch 2.13, 2-core CPU), largest relative deviation of loss / grad norm: FSDP2 1.1e-7 / 4.3e-6,
HSDP 2x2 1.1e-7 / 9.5e-7, PP2 (Interleaved1F1B and ZBVZeroBubble) 0 / 2.2e-16, rowwise
FSDP2xTP2 with full AC against rowwise at batch 8 5.1e-6 / 6.0e-5. RTOL = 1e-4 leaves 20x
headroom (1.7x for rowwise). CP2 scales each rank's half of the sequence on its own (6.7e-6 /
7.4e-5), and tensorwise FSDP2xTP2 each TP shard (1.9e-5 / 5.0e-5, 2026-11-27), so they get
CP_RTOL = 3e-4. What it tells
apart (measured over the first 4 steps of a 6-step run): scaling activations over batch 8 at
once moves the curves by up to 2e-4 (grad norm), training without float8 by up to 9e-4; a
missing or doubled gradient reduction, or unloaded weights, by 1e-2 or more.
"""

import json
import shutil
import sys

import pytest

from tests.distributed.launch import ROOT, TINY_JOB, read_metrics, run_checked, run_trainer

RTOL = 1e-4
CP_RTOL = 3e-4
FLOAT8 = ["--float8.enable", "--float8.emulate"]
JOB = [
    *[a for a in TINY_JOB if not a.startswith("--training.steps")],
    "--training.steps=4",
    "--training.local_batch_size=1",
]
FLOAT8_ALL_GATHER = ["--float8.fsdp_float8_all_gather", "--float8.precompute_scales"]
CHECKPOINTS = ["--checkpoint.enable", "--checkpoint.interval=2"]
PROFILE_LAST_STEP = [
    "--profiling.enable_profiling",
    "--profiling.profile_freq=4",
    "--profiling.profiler_warmup=0",
    "--profiling.profiler_active=1",
]


def train(nproc: int, folder, *args: str) -> str:
    args = [*JOB, *args, f"--job.dump_folder={folder}"]
    if nproc > 1:
        return run_trainer(nproc, args)
    return run_checked([sys.executable, "-m", "torchtitan.train", *args], timeout=300)


def scalar_all_reduces(folder) -> int:
    """DTensor's scalar all-reduces in rank 0's profiled step 4: the amax reductions of float8
    casts of TP-sharded tensors (eager; measured 96 with whole-tensor scales, 0 with shard
    scales, 2026-11-27)."""
    path = folder / "profile_traces" / "iteration_4" / "rank0_trace.json"
    events = json.loads(path.read_text())["traceEvents"]
    return sum(
        1
        for e in events
        if e.get("name") == "_c10d_functional::all_reduce"
        and (e.get("args", {}).get("Input Dims") or [None])[0] == []
    )


def curves_by_step(folder) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in read_metrics(folder)}


def assert_matches(folder, reference, steps=range(1, 5), rtol=RTOL) -> None:
    got, want = curves_by_step(folder), curves_by_step(reference)
    assert sorted(got) == list(steps), got
    for step in steps:
        assert got[step] == pytest.approx(want[step], rel=rtol), (step, got[step], want[step])


@pytest.fixture(scope="module")
def reference(seed_checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("float8_reference")
    train(1, folder, *FLOAT8, f"--checkpoint.initial_load_path={seed_checkpoint}")
    return folder


@pytest.fixture(scope="module")
def fsdp2(seed_checkpoint, tmp_path_factory):
    """FSDP2 with float8 all-gather and precomputed scales; full checkpoints at step 2 and the
    last step's weights alone, in bf16 (an export)."""
    folder = tmp_path_factory.mktemp("float8_fsdp2")
    out = train(
        2,
        folder,
        *FLOAT8,
        *FLOAT8_ALL_GATHER,
        *CHECKPOINTS,
        "--checkpoint.last_save_model_only",
        "--checkpoint.export_dtype=bfloat16",
        f"--checkpoint.initial_load_path={seed_checkpoint}",
    )
    assert "42 linears converted; kept in high precision: output (the model keeps it)" in out
    return folder


def test_fsdp2_float8_all_gather_matches_single_process(fsdp2, reference):
    assert_matches(fsdp2, reference)


@pytest.mark.slow
def test_fsdp2_tp2_shard_scales_match_single_process_within_shard_scaling(
    seed_checkpoint, reference, tmp_path
):
    """Tensorwise under TP: each TP rank scales its shards on its own, so the casts round like
    CP's (CP_RTOL), and no amax is all-reduced."""
    out = train(
        4,
        tmp_path,
        *FLOAT8,
        *FLOAT8_ALL_GATHER,
        "--parallelism.tensor_parallel_degree=2",
        "--activation_checkpoint.mode=selective",
        *PROFILE_LAST_STEP,
        f"--checkpoint.initial_load_path={seed_checkpoint}",
    )
    assert "float8 + TP: 42 linears scale their TP shards on their own" in out
    assert_matches(tmp_path, reference, rtol=CP_RTOL)
    assert scalar_all_reduces(tmp_path) == 0


@pytest.mark.parametrize(
    "schedule", ["Interleaved1F1B", pytest.param("ZBVZeroBubble", marks=pytest.mark.slow)]
)
def test_pp2_matches_single_process(schedule, seed_checkpoint, reference, tmp_path):
    """Each stage converted on its own; zero-bubble schedules split the float8 backward into
    its input- and weight-gradient halves. One window per microbatch, as in the reference."""
    train(
        2,
        tmp_path,
        *FLOAT8,
        "--parallelism.pipeline_parallel_degree=2",
        f"--parallelism.pipeline_parallel_schedule={schedule}",
        "--parallelism.pipeline_parallel_microbatch_size=1",
        "--training.local_batch_size=8",
        f"--checkpoint.initial_load_path={seed_checkpoint}",
    )
    assert_matches(tmp_path, reference)


@pytest.mark.slow
def test_hsdp_float8_all_gather_matches_single_process(seed_checkpoint, reference, tmp_path):
    """Replicas of 2 FSDP shards: the float8 all-gather's amax reduction covers the shard group,
    which holds the whole weight."""
    train(
        4,
        tmp_path,
        *FLOAT8,
        *FLOAT8_ALL_GATHER,
        "--parallelism.data_parallel_replicate_degree=2",
        "--parallelism.data_parallel_shard_degree=2",
        f"--checkpoint.initial_load_path={seed_checkpoint}",
    )
    assert_matches(tmp_path, reference)


@pytest.mark.slow
def test_cp2_matches_single_process_within_shard_scaling(seed_checkpoint, reference, tmp_path):
    """Each CP rank scales its half of the sequence, so the activation casts round differently
    from the whole window's; CP_RTOL still tells training without float8 (9e-4) apart."""
    train(
        2,
        tmp_path,
        *FLOAT8,
        *FLOAT8_ALL_GATHER,
        "--parallelism.context_parallel_degree=2",
        f"--checkpoint.initial_load_path={seed_checkpoint}",
    )
    assert_matches(tmp_path, reference, rtol=CP_RTOL)


@pytest.mark.slow
def test_rowwise_tp2_full_ac_matches_single_process(seed_checkpoint, tmp_path):
    """Rowwise scales are per row of each matmul operand (a token's activations, a weight's
    output row), so no layout or batch grouping changes them (under TP the rows are whole:
    shard scales are tensorwise only): the reference trains batch 8, with our rowwise backward
    (column-wise casts of gradients and inputs), against torchao's."""
    rowwise = [
        *FLOAT8,
        "--float8.recipe=rowwise",
        f"--checkpoint.initial_load_path={seed_checkpoint}",
    ]
    full_ac = "--activation_checkpoint.mode=full"
    one = train(1, tmp_path / "one", *rowwise, full_ac, "--training.local_batch_size=8")
    assert "output gradients and inputs cast column-wise" in one  # ours; DTensors: torchao's
    tp2 = ["--parallelism.tensor_parallel_degree=2", "--training.local_batch_size=8"]
    train(2, tmp_path / "tp2", *rowwise, *tp2, full_ac)
    assert_matches(tmp_path / "tp2", tmp_path / "one")


def test_resume_is_bitwise(fsdp2, tmp_path):
    shutil.copytree(fsdp2 / "checkpoint" / "step-2", tmp_path / "checkpoint" / "step-2")
    out = train(2, tmp_path, *FLOAT8, *FLOAT8_ALL_GATHER, *CHECKPOINTS)
    assert "continuing after step 2" in out
    resumed, straight = curves_by_step(tmp_path), curves_by_step(fsdp2)
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        assert resumed[step] == straight[step]  # bitwise: loss and grad norm


def test_checkpoints_move_between_float8_and_plain_runs(fsdp2, reference, tmp_path):
    """A float8 run's checkpoint resumes without float8 (one process), whose checkpoint resumes
    into float8 FSDP2 again: same names, shapes and dtypes, nothing float8 is stored. From the
    same state, float8 and fp32 losses differ by ~1e-4 (measured 3e-5 to 7.5e-5); from weights
    that were not loaded they would differ by ~1e-2."""
    plain = tmp_path / "plain"
    shutil.copytree(fsdp2 / "checkpoint" / "step-2", plain / "checkpoint" / "step-2")
    assert "continuing after step 2" in train(1, plain, *CHECKPOINTS)
    ref = curves_by_step(reference)
    for step, (loss, _) in curves_by_step(plain).items():
        assert loss == pytest.approx(ref[step][0], rel=1e-3), step

    fifth = {}
    for name, nproc, args in [("float8", 2, [*FLOAT8, *FLOAT8_ALL_GATHER]), ("fp32", 1, [])]:
        folder = tmp_path / name
        shutil.copytree(plain / "checkpoint" / "step-4", folder / "checkpoint" / "step-4")
        out = train(nproc, folder, *args, *CHECKPOINTS, "--training.steps=5")
        assert "continuing after step 4" in out
        (fifth[name],) = [loss for step, (loss, _) in curves_by_step(folder).items()]
    assert fifth["float8"] == pytest.approx(fifth["fp32"], rel=1e-3)


def test_exported_weights_are_plain_tensors_with_the_usual_names(fsdp2, tmp_path):
    import torch
    from safetensors.torch import load_file

    sys.path.insert(0, str(ROOT / "scripts"))
    import convert_to_hf

    from torchtitan.models.llama3 import Transformer, get_model_args
    from torchtitan.models.llama3.hf import expected_shapes, hf_name

    plain = Transformer(get_model_args("debugmodel", max_seq_len=64)).state_dict()
    full = convert_to_hf.checkpoint_tensors(fsdp2 / "checkpoint" / "step-2")
    assert full == {k: (tuple(v.shape), torch.float32) for k, v in plain.items()}
    exported = convert_to_hf.checkpoint_tensors(fsdp2 / "checkpoint" / "step-4")
    assert exported == {k: (tuple(v.shape), torch.bfloat16) for k, v in plain.items()}

    convert_to_hf.convert(fsdp2 / "checkpoint" / "step-4", tmp_path / "hf")
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    args = get_model_args("debugmodel")
    assert set(tensors) == {hf_name(name) for name in expected_shapes(args)}
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
