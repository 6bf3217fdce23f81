"""GPU time of the Mixture-of-Experts layers in one profiled training step, from its trace.

    python benchmarks/tools/moe_kernel_time.py TRACE.json[.gz] [TRACE ...]

A compiled block runs attention and its MoE layer in one graph, so the profiler cannot tell them
apart by call stack; this tool recognises MoE-layer work by kernel name, alike for both
frameworks (ours and the reference write the same torch.profiler format):

* grouped GEMMs: cuBLAS/CUTLASS kernels over a group of problems (``GroupProblemShape``) and
  Triton templates of ``_grouped_mm``;
* the weight casts feeding them: fused kernels named after ``_grouped_mm`` that are not GEMMs;
* routing and token movement: top-k, sorts, histograms, gathers, scatters, ``index_*`` kernels
  (embedding and loss kernels excluded);
* the experts' activation: SiLU kernels (in MoE flavors every feed-forward is a MoE layer).

Kernels of neither kind (attention, dense matmuls, norms, the loss, the optimizer) are the
rest of the step. A kernel the rules miss counts as "rest", so the MoE figure is a lower bound
on both sides.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

KERNELS = ("kernel", "gpu_memcpy", "gpu_memset")
NOT_MOE = ("embedding", "nll_loss", "log_softmax", "cross_entropy", "sdpa", "attention", "fmha")
ROUTING = ("topk", "radixsort", "radix_sort", "histc", "gather", "scatter", "index", "bincount")


def moe_part(name: str) -> str | None:
    """Which MoE part a kernel belongs to, or None for the rest of the step."""
    lowered = name.lower()
    if any(n in lowered for n in NOT_MOE):
        return None
    if "groupproblemshape" in lowered or ("grouped_mm" in lowered and "triton_tem" in lowered):
        return "grouped GEMMs"
    if "grouped_mm" in lowered:
        return "grouped GEMM weight casts"
    if any(n in lowered for n in ROUTING):
        return "routing and token movement"
    if "silu" in lowered:
        return "expert activation"
    return None


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in KERNELS]


def summarize(events: list[dict]) -> tuple[float, dict[str, float]]:
    """(all GPU kernel time, MoE time per part), in ms."""
    parts: dict[str, float] = defaultdict(float)
    total = 0.0
    for e in events:
        ms = e.get("dur", 0) / 1e3
        total += ms
        part = moe_part(e.get("name", "")) if e.get("cat") == "kernel" else None
        if part:
            parts[part] += ms
    return total, dict(parts)


def report(path: Path) -> str:
    total, parts = summarize(load(path))
    moe = sum(parts.values())
    lines = [f"== {path}", f"GPU kernel time {total:.1f} ms; MoE layers {moe:.1f} ms"]
    lines += [f"  {name:28s} {ms:7.1f} ms" for name, ms in sorted(parts.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    args = ap.parse_args(argv)
    for path in args.traces:
        print(report(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
