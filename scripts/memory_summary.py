"""What the CUDA allocator held at its peak, from a memory snapshot.

    python scripts/memory_summary.py SNAPSHOT.pickle [--top 25] [--last 20]

Snapshots come from ``--profiling.enable_memory_snapshot`` (``memory_snapshot/iteration_N/
rankR_memory_snapshot.pickle``; the reference framework writes the same format). The snapshot's
allocation history covers the last recorded events; blocks allocated before it show up as
"allocated before the recorded history". The script replays the history to find the moment of
peak allocated memory and groups the blocks live then by where they were allocated: the innermost
frame in a ``torchtitan`` file (either framework) and the innermost Python frame.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from collections import defaultdict
from pathlib import Path

GiB = 1024**3
BEFORE_HISTORY = ("allocated before the recorded history", "")


def _python_frames(frames: list[dict]) -> list[dict]:
    return [f for f in frames or [] if str(f.get("filename", "")).endswith(".py")]


# C++ frames that say nothing about who allocated (the allocator and tensor factories).
_PLUMBING = ("alloc", "Alloc", "empty", "c10::", "at::detail", "at::TensorBase", "at::_ops::")


def _cpp_hint(frames: list[dict]) -> str:
    """The innermost C++ frame that is not allocator or factory plumbing (names shortened)."""
    for f in frames or []:
        name = str(f.get("name", ""))
        if name and not any(p in name for p in _PLUMBING) and not name.startswith("??"):
            return name.split("(")[0][-70:]
    return ""


def origin(frames: list[dict]) -> tuple[str, str]:
    """(innermost project frame, innermost Python frame), frames listed innermost first; for a
    block without Python frames (autograd's backward thread, C++ code), its innermost
    informative C++ frame."""
    py = _python_frames(frames)
    if not py:
        return ("no Python frame", _cpp_hint(frames))

    def where(f: dict) -> str:
        parts = Path(f["filename"]).parts
        short = "/".join(parts[-2:])
        return f"{short}:{f.get('line', '?')} {f.get('name', '?')}"

    project = next((f for f in py if "torchtitan" in f["filename"]), None)
    return (where(project) if project else "(no torchtitan frame)", where(py[0]))


def live_at_end(snapshot: dict, device: int) -> dict[int, tuple[int, tuple[str, str]]]:
    live = {}
    for seg in snapshot.get("segments", []):
        if seg.get("device", device) != device:
            continue
        for block in seg.get("blocks", []):
            if block.get("state") == "active_allocated":
                live[block["address"]] = (block["size"], origin(block.get("frames", [])))
    return live


def live_at_start(end: dict, trace: list[dict]) -> dict[int, tuple[int, tuple[str, str]]]:
    """Undo the history backwards: what was live before its first event."""
    live = dict(end)
    for event in reversed(trace):
        action, addr = event.get("action"), event.get("addr")
        if action == "alloc":
            live.pop(addr, None)
        elif action == "free_completed":
            live[addr] = (event["size"], BEFORE_HISTORY)
    return live


def peak(snapshot: dict, device: int = 0) -> tuple[int, dict, int, list]:
    """-> (peak allocated bytes, live blocks at the peak, peak reserved bytes in the history,
    the allocations of the history up to the peak as (size, origin), oldest first)."""
    traces = snapshot.get("device_traces", [])
    trace = traces[device] if device < len(traces) else []
    live = live_at_start(live_at_end(snapshot, device), trace)
    total = sum(size for size, _ in live.values())
    best, best_live = total, dict(live)
    reserved = sum(
        s.get("total_size", 0) for s in snapshot.get("segments", []) if s.get("device") == device
    )
    for event in reversed(trace):  # reserved at the start of the history, as for live blocks
        if event.get("action") in ("segment_alloc", "segment_map"):
            reserved -= event["size"]
        elif event.get("action") in ("segment_free", "segment_unmap"):
            reserved += event["size"]
    peak_reserved = reserved
    allocations, at_peak = [], 0
    for event in trace:
        action = event.get("action")
        if action == "alloc":
            live[event["addr"]] = (event["size"], origin(event.get("frames", [])))
            allocations.append(live[event["addr"]])
            total += event["size"]
            if total > best:
                best, best_live, at_peak = total, dict(live), len(allocations)
        elif action == "free_completed" and event.get("addr") in live:
            total -= live.pop(event["addr"])[0]
        elif action in ("segment_alloc", "segment_map"):
            reserved += event["size"]
            peak_reserved = max(peak_reserved, reserved)
        elif action in ("segment_free", "segment_unmap"):
            reserved -= event["size"]
    return best, best_live, peak_reserved, allocations[:at_peak]


def report(name: str, snapshot: dict, top: int, device: int = 0, last: int = 0) -> str:
    best, live, reserved, allocations = peak(snapshot, device)
    groups: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for size, where in live.values():
        groups[where][0] += size
        groups[where][1] += 1
    lines = [
        f"== {name}",
        f"peak allocated {best / GiB:.2f} GiB in {len(live)} blocks; peak reserved in the "
        f"history {reserved / GiB:.2f} GiB",
        f"live at the peak, by origin (top {top}):",
    ]
    for (project, inner), (size, count) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {size / GiB:7.2f} GiB {count:6d}x  {project}  <-  {inner}")
    if last:
        lines.append(f"the last {last} allocations up to the peak (oldest first):")
        for size, (project, inner) in allocations[-last:]:
            lines.append(f"  {size / GiB:9.4f} GiB  {project}  <-  {inner}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshots", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=25, help="how many origins to list")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index in the snapshot")
    parser.add_argument(
        "--last", type=int, default=0, help="also list the last N allocations up to the peak"
    )
    args = parser.parse_args(argv)
    for path in args.snapshots:
        try:
            with open(path, "rb") as f:
                snapshot = pickle.load(f)
        except (OSError, pickle.UnpicklingError, EOFError) as e:
            print(f"error: cannot read snapshot {path}: {e}", file=sys.stderr)
            return 2
        print(report(str(path), snapshot, args.top, args.device, args.last))
    return 0


if __name__ == "__main__":
    sys.exit(main())
