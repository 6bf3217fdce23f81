"""Keep only a Chrome trace's GPU activity, small enough to bring back from a device call.

    python benchmarks/tools/gpu_events.py TRACE.json OUT.json.gz

Writes ``{"traceEvents": [...]}`` with the GPU kernels, copies and memsets of TRACE (name, stream,
start, duration, and the collective's process group and dtype where recorded), gzipped; it opens in
scripts/trace_summary.py and in Perfetto like the full trace.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from trace_summary import gpu_events  # noqa: E402

KEPT_ARGS = ("Process Group Name", "Process Group Description", "dtype", "In msg nelems")


def compact(event: dict) -> dict:
    args = {k: v for k, v in event.get("args", {}).items() if k in KEPT_ARGS}
    keys = ("ph", "cat", "name", "pid", "tid", "ts", "dur")
    return {**{k: event[k] for k in keys if k in event}, "args": args}


def main() -> None:
    source, target = Path(sys.argv[1]), Path(sys.argv[2])
    events = [compact(e) for e in gpu_events(json.loads(source.read_text()))]
    with gzip.open(target, "wt") as f:
        json.dump({"traceEvents": events}, f)
    print(f"{target}: {len(events)} GPU events")


if __name__ == "__main__":
    main()
