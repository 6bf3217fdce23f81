"""Where a profiled step's GPU time goes, from a torch.profiler Chrome trace.

    python scripts/trace_summary.py TRACE.json [TRACE.json ...] [--top 15]

For each trace (e.g. ``profile_traces/iteration_N/rank0_trace.json``, written by
``--profiling.enable_profiling``; the reference framework writes the same format) it prints:

* the window: from the first to the last GPU activity, and how much of it the GPU was idle
  (no kernel, copy or memset on any stream) — CPU-side gaps, syncs and launch overhead;
* kernel time by category (matmul, attention, communication, compiled fusions, eager
  elementwise, optimizer, copies, other), summed per kernel, so overlapping streams can add up
  to more than the window;
* communication that ran while no computation did (exposed communication), in all and per
  collective kernel (with its process group and dtype where the trace records them; two
  collectives exposed at once each count, so the parts can add up to more than the total);
* the kernels that took the most time.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from collections import defaultdict
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")

# First match wins; matched against the lower-cased kernel name.
KERNEL_CLASSES = (
    ("communication", ("nccl",)),
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("matmul", ("gemm", "xmma", "cutlass", "nvjet", "cublas", "triton_tem", "_mm_", "matmul")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("compiled fusion", ("triton_",)),
    ("eager elementwise/reduce", ("elementwise", "reduce_kernel", "vectorized", "unrolled")),
)


def kernel_class(name: str, category: str) -> str:
    if category != "kernel":
        return "copy/memset"
    lowered = name.lower()
    for label, needles in KERNEL_CLASSES:
        if any(n in lowered for n in needles):
            return label
    return "other"


def gpu_events(trace: dict) -> list[dict]:
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    return [
        e
        for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES and e.get("dur", 0) > 0
    ]


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]], b_from: int = 0) -> float:
    """Total length of the intersection of two sorted, disjoint interval lists (``b`` read from
    index ``b_from``: the intervals before it are known to end before ``a`` starts)."""
    i, j = 0, b_from
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def covered(span: tuple[float, float], intervals: list[tuple[float, float]], starts: list[float]):
    """How much of ``span`` the sorted, disjoint ``intervals`` (whose starts are ``starts``)
    cover; a binary search finds the first one that can reach it."""
    return overlap([span], intervals, max(0, bisect.bisect_right(starts, span[0]) - 1))


def comm_label(event: dict) -> str:
    """A collective kernel's name, with the process group and dtype the profiler recorded."""
    args = event.get("args", {})
    extra = [str(args[k]) for k in ("Process Group Description", "dtype") if args.get(k)]
    name = event.get("name", "?")[:70]
    return f"{name} [{', '.join(extra)}]" if extra else name


def summarize(events: list[dict]) -> dict:
    """Times in microseconds (the trace's unit)."""
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events]
    by_class: dict[str, float] = defaultdict(float)
    by_kernel: dict[str, float] = defaultdict(float)
    comm, compute = [], []
    for e, span in zip(events, spans):
        label = kernel_class(e.get("name", ""), e["cat"])
        by_class[label] += e["dur"]
        by_kernel[e.get("name", "?")] += e["dur"]
        (comm if label == "communication" else compute).append(span)
    busy = union(spans)
    window = (busy[-1][1] - busy[0][0]) if busy else 0.0
    comm_u, compute_u = union(comm), union(compute)
    exposed_by_kernel: dict[str, float] = defaultdict(float)
    starts = [s for s, _ in compute_u]
    for e, span in zip(events, spans):
        if kernel_class(e.get("name", ""), e["cat"]) == "communication":
            exposed_by_kernel[comm_label(e)] += e["dur"] - covered(span, compute_u, starts)
    return {
        "window": window,
        "idle": window - length(busy),
        "by_class": dict(by_class),
        "by_kernel": dict(by_kernel),
        "communication": length(comm_u),
        "exposed_communication": length(comm_u) - overlap(comm_u, compute_u),
        "exposed_by_kernel": dict(exposed_by_kernel),
    }


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "   n/a"


def report(name: str, s: dict, top: int) -> str:
    w = s["window"]
    lines = [
        f"== {name}",
        f"GPU window {w / 1e3:.1f} ms; idle {s['idle'] / 1e3:.1f} ms ({_pct(s['idle'], w)})",
        f"communication {s['communication'] / 1e3:.1f} ms, exposed "
        f"{s['exposed_communication'] / 1e3:.1f} ms ({_pct(s['exposed_communication'], w)})",
        "kernel time by category (share of the window):",
    ]
    for label, t in sorted(s["by_class"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {label:26s} {t / 1e3:9.1f} ms {_pct(t, w)}")
    lines.append("exposed communication by collective kernel:")
    for kname, t in sorted(s["exposed_by_kernel"].items(), key=lambda kv: -kv[1])[:8]:
        lines.append(f"  {t / 1e3:9.1f} ms {_pct(t, w)}  {kname}")
    lines.append(f"top {top} kernels:")
    for kname, t in sorted(s["by_kernel"].items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {t / 1e3:9.1f} ms {_pct(t, w)}  {kname[:110]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15, help="how many kernels to list")
    args = parser.parse_args(argv)
    for path in args.traces:
        try:
            trace = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"error: cannot read trace {path}: {e}", file=sys.stderr)
            return 2
        events = gpu_events(trace)
        if not events:
            print(f"error: {path} has no GPU events (profiled on CPU?)", file=sys.stderr)
            return 2
        print(report(str(path), summarize(events), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
