"""Loss-parity suite: every layout, from one seed checkpoint, reproduces the single-process curve.

fp32 on CPU/gloo. Layouts differ from the reference only in the order of floating-point
reductions (sharded matmuls, reduce-scatters, gradient averaging). Measured on the 2-core CI
machine kind (torch 2.13): the largest relative deviation over all layouts and 6 steps was 1.1e-7
for the loss and 1.1e-8 for the grad norm. RTOL = 1e-5 leaves headroom for other CPUs while a
real error (a wrong plan, a missing gradient reduction, a double-counted shard) moves them by far
more.
"""

import pytest

from tests.distributed.launch import (
    TINY_JOB,
    assert_curves_match,
    curves,
    from_seed,
    run_trainer,
    with_slow,
)

RTOL = 1e-5

LAYOUTS = {
    # name: (processes, overrides)
    "fsdp2_fullac_accum2": (
        2,
        ["--training.local_batch_size=2", "--activation_checkpoint.mode=full"],
    ),
    "ddp2_selective_op": (
        2,
        [
            "--training.local_batch_size=4",
            "--parallelism.data_parallel_replicate_degree=2",
            "--parallelism.data_parallel_shard_degree=1",
            "--activation_checkpoint.mode=selective",
        ],
    ),
    "tp2_every2": (
        2,
        [
            "--training.local_batch_size=8",
            "--parallelism.tensor_parallel_degree=2",
            "--activation_checkpoint.mode=selective",
            "--activation_checkpoint.selective_ac_option=2",
        ],
    ),
    # Loss parallel with the in-place loss: each rank overwrites its vocabulary shard's logits.
    "tp2_in_place_loss": (
        2,
        [
            "--training.local_batch_size=8",
            "--parallelism.tensor_parallel_degree=2",
            "--training.logits_loss=in_place",
        ],
    ),
    # Compile + TP + full AC: the checkpoint wraps the compiled block and FSDP the checkpoint
    # (torch 2.13 fails the other order, docs/parallelism.md).
    "fsdp2_tp2_compile_full_ac": (
        4,
        [
            "--training.local_batch_size=4",
            "--parallelism.tensor_parallel_degree=2",
            "--compile.enable",
            "--activation_checkpoint.mode=full",
        ],
    ),
    # The experimental row-sharded embedding: looked up where its vocabulary rows live instead
    # of all-gathered by FSDP. With the fused AdamW, whose found_inf input carries the
    # non-finite check without a per-step sync.
    "fsdp2_sharded_embedding_fused_adamw": (
        2,
        [
            "--training.local_batch_size=4",
            "--experimental.fsdp_sharded_embedding=true",
            "--optimizer.implementation=fused",
        ],
    ),
    # The 8-rank meshes of the 8-GPU runs (issue #8), on CPU.
    "fsdp8": (8, ["--training.local_batch_size=1"]),
    "hsdp2x4": (
        8,
        ["--training.local_batch_size=1", "--parallelism.data_parallel_replicate_degree=2"],
    ),
    "fsdp2_cp2_tp2": (
        8,
        [
            "--training.local_batch_size=4",
            "--parallelism.context_parallel_degree=2",
            "--parallelism.tensor_parallel_degree=2",
        ],
    ),
    # CP's ring attention compiled, with its K/V exchanges reordered for overlap (the default).
    "fsdp2_cp2_compile_selective_op": (
        4,
        [
            "--training.local_batch_size=4",
            "--parallelism.context_parallel_degree=2",
            "--compile.enable",
            "--activation_checkpoint.mode=selective",
        ],
    ),
    "fsdp2_tp2_compile_loss_selective_op": (
        4,
        [
            "--training.local_batch_size=4",
            "--parallelism.tensor_parallel_degree=2",
            "--compile.enable",
            "--compile.loss",
            "--activation_checkpoint.mode=selective",
        ],
    ),
}


# In the slow tier (make test-all): compiled TP and CP, many-rank FSDP and HSDP are also run by
# the CP x TP, DDP and fault-tolerance rows here and, compiled under full AC with TP, by the
# document-masking parity test's row of the same layout.
SLOW = {
    "fsdp2_tp2_compile_full_ac",
    "fsdp2_tp2_compile_loss_selective_op",
    "fsdp2_cp2_compile_selective_op",
    "fsdp8",
    "hsdp2x4",
}


@pytest.mark.parametrize("layout", with_slow(LAYOUTS, SLOW))
def test_layout_matches_single_process(layout, seed_checkpoint, reference_curves, tmp_path):
    nproc, overrides = LAYOUTS[layout]
    assert_layout_matches(nproc, overrides, seed_checkpoint, reference_curves, tmp_path)


def assert_layout_matches(nproc, overrides, seed_checkpoint, reference_curves, tmp_path):
    """Train TINY_JOB from the seed under ``overrides``; loss and grad norm match the reference."""
    run_trainer(nproc, [*TINY_JOB, *overrides, *from_seed(seed_checkpoint, tmp_path)])
    assert_curves_match(curves(tmp_path), reference_curves, points=6, rtol=RTOL)
