"""examples/parallelize_custom_model.py: the helpers on a non-Llama model reproduce one process.

The example's GPT-style model (ModuleList ``blocks``, LayerNorms with biases, fused qkv, learned
positions) is trained 5 steps single-process (the reference) and as 4 ranks (``run_ranks``) as
* dp 2 x tp 2: its own TP/SP plan, selective-op AC, FSDP2 over dp, loss parallel;
* pp 2 x dp 2: two 1F1B pipeline stages cut by ``build_stage_module`` with its own names, each
  FSDP2-sharded over dp;
* pp 2 x tp 2: two GPipe stages, each tensor parallel, loss parallel on the last.
fp32 on CPU/gloo: the layouts differ only in the order of floating-point reductions. Measured on
the 2-core CI machine kind (torch 2.13): max relative deviation 1.8e-7 (loss) and 4.7e-7 (grad
norm); 15-18 s per layout.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.distributed.launch import ROOT, run_checked, run_ranks

EXAMPLE = ROOT / "examples" / "parallelize_custom_model.py"
RTOL = 1e-5
STEPS = 5

# name -> (example flags, expected layout fields, qkv weight placements on rank 0)
LAYOUTS = {
    "dp2_tp2": (
        ["--tp=2", "--ac=selective"],
        dict(pp=1, dp=2, tp=2, stage_blocks=[0, 1]),
        2,  # sharded on both mesh dimensions, column-wise over tp
    ),
    "pp2_dp2_1f1b": (
        ["--pp=2", "--pp-schedule=1F1B"],
        dict(pp=2, dp=2, tp=1, pp_schedule="1F1B", stage_blocks=[0]),
        1,  # FSDP over dp
    ),
    "pp2_tp2_gpipe": (
        ["--pp=2", "--tp=2", "--pp-schedule=GPipe", "--ac=selective"],
        dict(pp=2, dp=1, tp=2, pp_schedule="GPipe", stage_blocks=[0]),
        1,  # column-wise over tp
    ),
}


def _max_rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.fixture(scope="module", autouse=True)
def this_checkout():
    """The example runs as a script: make it import this checkout's torchtitan, not whichever
    one is installed."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(ROOT))
        yield


@pytest.fixture(scope="module")
def reference(tmp_path_factory, this_checkout) -> dict:
    out = tmp_path_factory.mktemp("custom_model") / "reference.json"
    run_checked([sys.executable, str(EXAMPLE), f"--steps={STEPS}", f"--out={out}"], timeout=60)
    ref = json.loads(out.read_text())
    assert ref["layout"]["qkv_weight_placements"] is None
    assert len(ref["losses"]) == STEPS
    assert ref["losses"][-1] < ref["losses"][0]  # it trains
    return ref


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_process(name, reference, tmp_path):
    flags, expected_layout, qkv_mesh_dims = LAYOUTS[name]
    out = tmp_path / f"{name}.json"
    run_ranks(4, [str(EXAMPLE), *flags, f"--steps={STEPS}", f"--out={out}"], timeout=120)
    got = json.loads(out.read_text())

    # The run really had this layout: mesh, pipeline stage and how qkv's weight is sharded.
    layout = got["layout"]
    assert layout["world_size"] == 4, layout
    assert {k: layout[k] for k in expected_layout} == expected_layout, layout
    assert len(layout["qkv_weight_placements"]) == qkv_mesh_dims, layout
    assert layout["qkv_weight_placements"][-1].endswith("S(0)"), layout

    assert len(got["losses"]) == STEPS
    loss_dev = _max_rel(got["losses"], reference["losses"])
    norm_dev = _max_rel(got["grad_norms"], reference["grad_norms"])
    print(f"{name}: max relative deviation: loss {loss_dev:.2e}, grad norm {norm_dev:.2e}")
    assert got["losses"] == pytest.approx(reference["losses"], rel=RTOL), (got, reference)
    assert got["grad_norms"] == pytest.approx(reference["grad_norms"], rel=RTOL), (got, reference)
