"""scripts/trace_summary.py and scripts/memory_summary.py on hand-made traces and snapshots."""

import json
import pickle

from scripts import memory_summary, trace_summary


def kernel(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


def test_trace_summary_idle_categories_and_exposed_communication():
    events = [
        kernel("sm90_xmma_gemm_bf16", 0, 40),
        kernel("ncclDevKernel_AllGather_RING", 30, 30),  # 10 overlapped, 20 exposed
        kernel("triton_poi_fused_mul_0", 70, 10),  # idle 60..70
        kernel("Memcpy HtoD", 80, 5, cat="gpu_memcpy"),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500},  # not GPU
    ]
    s = trace_summary.summarize(trace_summary.gpu_events({"traceEvents": events}))
    assert s["window"] == 85
    assert s["idle"] == 10
    assert s["communication"] == 30
    assert s["exposed_communication"] == 20
    assert s["exposed_by_kernel"] == {"ncclDevKernel_AllGather_RING": 20}
    assert s["by_class"] == {
        "matmul": 40,
        "communication": 30,
        "compiled fusion": 10,
        "copy/memset": 5,
    }


def test_exposed_time_per_collective_counts_each_of_two_concurrent_ones():
    events = [
        kernel("nvjet_gemm", 0, 10),
        kernel("nvjet_gemm", 20, 10),
        kernel("ncclDevKernel_AllGather", 5, 30),  # covered 5..10 and 20..30: 15 exposed
        kernel("ncclDevKernel_ReduceScatter", 12, 4),  # alone with the all-gather: 4 exposed
    ]
    s = trace_summary.summarize(trace_summary.gpu_events({"traceEvents": events}))
    assert s["exposed_by_kernel"] == {
        "ncclDevKernel_AllGather": 15,
        "ncclDevKernel_ReduceScatter": 4,
    }
    assert s["exposed_communication"] == 15  # 10..20 and 30..35, counted once


def test_trace_summary_cli(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [kernel("flash_fwd_kernel", 0, 1000)]}))
    assert trace_summary.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "attention" in out and "idle 0.0 ms" in out
    comm = kernel("ncclDevKernel_SendRecv", 0, 50_000)
    comm["args"] = {"Process Group Description": "cp", "dtype": "Float"}
    path.write_text(json.dumps({"traceEvents": [comm, kernel("nvjet_gemm", 10_000, 20_000)]}))
    assert trace_summary.main([str(path)]) == 0
    assert "30.0 ms  60.0%  ncclDevKernel_SendRecv [cp, Float]" in capsys.readouterr().out
    (tmp_path / "cpu.json").write_text(json.dumps({"traceEvents": []}))
    assert trace_summary.main([str(tmp_path / "cpu.json")]) == 2


def frames(*names):
    return [{"filename": f"/x/torchtitan/{n}.py", "line": 1, "name": n} for n in names]


def test_memory_summary_replays_history_to_the_peak():
    # Block A (100) lives before the history and to the end; B (50) is allocated and freed in it;
    # C (30) is allocated after B is freed. Peak: A + B = 150.
    snapshot = {
        "segments": [
            {
                "device": 0,
                "total_size": 1000,
                "blocks": [
                    {"address": 1, "size": 100, "state": "active_allocated", "frames": frames("a")},
                    {"address": 3, "size": 30, "state": "active_allocated", "frames": frames("c")},
                ],
            }
        ],
        "device_traces": [
            [
                {"action": "alloc", "addr": 2, "size": 50, "frames": frames("b")},
                {"action": "free_completed", "addr": 2, "size": 50},
                {"action": "alloc", "addr": 3, "size": 30, "frames": frames("c")},
            ]
        ],
    }
    best, live, reserved, allocations = memory_summary.peak(snapshot)
    assert best == 150
    assert [size for size, _ in allocations] == [50]  # up to the peak, not C after it
    assert sorted(size for size, _ in live.values()) == [50, 100]
    assert reserved == 1000
    origins = {where[0] for _, where in live.values()}
    assert origins == {"torchtitan/a.py:1 a", "torchtitan/b.py:1 b"}


def test_memory_summary_cli(tmp_path, capsys):
    path = tmp_path / "s.pickle"
    snap = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 2**30}]]}
    path.write_bytes(pickle.dumps(snap))
    assert memory_summary.main([str(path), "--last", "3"]) == 0
    out = capsys.readouterr().out
    assert "peak allocated 1.00 GiB" in out
    assert "the last 3 allocations up to the peak" in out


def test_memory_summary_names_the_cpp_frame_of_blocks_without_python_frames():
    cpp = [
        {"filename": "c10/cuda/CUDACachingAllocator.cpp", "name": "c10::cuda::malloc(...)"},
        {"filename": "aten/src/ATen/EmptyTensor.cpp", "name": "at::detail::empty_generic(...)"},
        {"filename": "aten/src/ATen/native/Linear.cpp", "name": "at::native::mm_out(...)"},
    ]
    assert memory_summary.origin(cpp) == ("no Python frame", "at::native::mm_out")
