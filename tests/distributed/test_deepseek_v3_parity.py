"""DeepSeek-V3 under the shared composition: each layout, from one seed checkpoint, reproduces
the single-process loss, grad-norm and load-imbalance curves (fp32, CPU/gloo), with the seed and
reference machinery of the Qwen3 rows (``test_qwen3_parity``).

``debugmodel`` has a query latent, YaRN, a dense first block and sigmoid group-limited routing
with a shared expert; the rows are the cheapest that cover MLA's tensor-parallel plan, expert
parallelism under FSDP, and a pipeline split of dense and MoE blocks under EP.
"""

from __future__ import annotations

import pytest

from tests.distributed.launch import TINY_JOB, assert_curves_match, curves, from_seed, run_trainer
from tests.distributed.test_parity import RTOL
from tests.distributed.test_qwen3_parity import imbalance, references  # noqa: F401 (fixture)

DEEPSEEK = ("--model.name=deepseek_v3", "--model.flavor=debugmodel")

LAYOUTS = {
    # name: (processes, overrides)
    # The two ranks split each layer's 8 experts; FSDP shards the rest over both.
    "ep2_fsdp2": (2, ["--training.local_batch_size=4", "--parallelism.expert_parallel_degree=2"]),
    # MLA's plan: latents on sequence shards, up-projections column-wise, the RoPE key gathered;
    # the MoE layers run on the sequence shards, the TP pair being the EP group.
    "tp2_ep2": (
        2,
        [
            "--training.local_batch_size=8",
            "--parallelism.tensor_parallel_degree=2",
            "--parallelism.expert_parallel_degree=2",
        ],
    ),
    # Stage 0 holds the dense block and a MoE block, stage 1 the other two MoE blocks.
    "pp2_ep2": (
        4,
        [
            "--training.local_batch_size=4",
            "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.pipeline_parallel_microbatch_size=2",
            "--parallelism.expert_parallel_degree=2",
        ],
    ),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_deepseek_v3_layout_matches_single_process(layout, references, tmp_path):  # noqa: F811
    nproc, overrides = LAYOUTS[layout]
    seed, reference = references(DEEPSEEK)
    out = run_trainer(nproc, [*DEEPSEEK, *TINY_JOB, *overrides, *from_seed(seed, tmp_path)])
    assert "training done" in out and "ep=2" in out, out[-2000:]
    assert_curves_match(curves(tmp_path), curves(reference), points=6, rtol=RTOL)
    assert imbalance(tmp_path) == pytest.approx(imbalance(reference), rel=1e-6)
