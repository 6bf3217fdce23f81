"""benchmarks/tools/moe_kernel_time.py on a hand-made trace: which kernels count as MoE work."""

import importlib.util
import json
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "benchmarks" / "tools" / "moe_kernel_time.py"
spec = importlib.util.spec_from_file_location("moe_kernel_time", TOOL)
moe_kernel_time = importlib.util.module_from_spec(spec)
spec.loader.exec_module(moe_kernel_time)


def kernel(name, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": 0, "dur": dur}


def test_moe_kernels_are_recognised_by_name(tmp_path):
    events = [
        kernel("cutlass13device_kernel_GemmUniversal_GroupProblemShape_bf16", 3000),
        kernel("triton_poi_fused__grouped_mm__to_copy_transpose_2", 1000),
        kernel("void at::native::sbtopk::gatherTopK<float>", 500),
        kernel("triton_poi_fused_add_floor_divide_index_put_new_zeros_18", 500),
        kernel("triton_poi_fused_mul_silu_silu_backward_16", 250),
        kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 4000),  # a dense matmul
        kernel("triton_red_fused__log_softmax_gather_nll_loss_forward_0", 700),  # the loss
        kernel("void at::native::embedding_backward_feature_kernel", 300),
        kernel("cudnn_generated_fort_native_sdpa_sm90_flash_bprop", 2000),
        kernel("Memcpy DtoD (Device -> Device)", 100, cat="gpu_memcpy"),
        {"ph": "X", "cat": "cpu_op", "name": "aten::index", "ts": 0, "dur": 9000},  # CPU side
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    total, parts = moe_kernel_time.summarize(moe_kernel_time.load(path))
    assert total == 12.35
    assert parts == {
        "grouped GEMMs": 3.0,
        "grouped GEMM weight casts": 1.0,
        "routing and token movement": 1.0,
        "expert activation": 0.25,
    }
    assert "MoE layers 5.2 ms" in moe_kernel_time.report(path)
