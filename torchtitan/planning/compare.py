"""Estimates against measured steps: ``python -m torchtitan.planning.compare [POINTS.toml]``
prints the calibration table of docs/planning.md (default: tests/unit/data/planning_measured.toml),
then the superseded points for the record.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from torchtitan.config import parse_args
from torchtitan.planning import calibration as cal
from torchtitan.planning.hardware import GIB, make_hardware
from torchtitan.planning.layout import Layout, Workload
from torchtitan.planning.memory import estimate_memory, unit_gather_bytes
from torchtitan.planning.schedules import inflight_chunks, rank_stages
from torchtitan.planning.timing import estimate_time

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_POINTS = Path(__file__).resolve().parents[2] / "tests/unit/data/planning_measured.toml"
MEMORY_TARGET = 0.10
TOKENS_TARGET = 0.15


@dataclass(frozen=True)
class Comparison:
    name: str
    card: str
    source: str
    memory_gib: float  # measured
    memory_estimate_gib: float  # of the code the point ran: today's model + adjustment_gib
    adjustment_gib: float  # what that code held on top of today's (last block, K/V repeat)
    tokens_per_second: float  # measured, per GPU
    tokens_estimate: float
    memory_tolerance: float
    tokens_tolerance: float

    @property
    def memory_error(self) -> float:
        return self.memory_estimate_gib / self.memory_gib - 1

    @property
    def tokens_error(self) -> float:
        return self.tokens_estimate / self.tokens_per_second - 1


def load_points(path: Path = DEFAULT_POINTS, superseded: bool = False) -> list[dict]:
    """The measured points (those marked ``superseded`` only when asked)."""
    with open(path, "rb") as f:
        points = tomllib.load(f)["point"]
    return [p for p in points if bool(p.get("superseded")) == superseded]


# A point's marker -> the Float8Setting code path its older code did not run (the point ran
# torchao's instead; no option selects torchao's paths today).
OLD_FLOAT8_CODE = {
    "torchao_float8_backward": "own_backward",
    "torchao_all_gather_cast": "one_kernel_all_gather_cast",
    "float8_tp_amax_all_reduce": "tp_shard_scales",
}


def _old_code_workload(point: dict, work: Workload) -> Workload:
    """The workload as the code a point was measured on ran it: the float8 code paths of
    OLD_FLOAT8_CODE that it lacked turned off."""
    off = {field: False for marker, field in OLD_FLOAT8_CODE.items() if point.get(marker)}
    if not off or work.float8 is None:
        return work
    return work.with_(float8=dataclasses.replace(work.float8, **off))


def _old_code_bytes(point: dict, work: Workload, layout: Layout) -> float:
    """What the code a point was measured on held at the peak on top of today's model: the
    last block's gathered weights (before the last block resharded after forward), pre-GQA
    AC-off blocks' repeated K/V, and the float32 residual stream under autocast (before the
    model cast the embedding's output to bf16), all scaled by the allocator overhead like every
    part."""
    total = 0.0
    reshards = layout.pp == 1 and work.reshard_policy != "never"
    if point.get("last_block_gathered") and layout.data_parallel and reshards:
        total += unit_gather_bytes(work, layout)[0]
    extra = point.get("extra_kib_per_token_block", 0) * 1024
    if point.get("fp32_residual") and work.bf16 and not layout.data_parallel:
        extra += 2 * work.model.dim / layout.tp  # 2 more bytes per residual value
    if extra:
        stages = rank_stages(work, layout)[0]
        tokens = work.microbatch_tokens(layout)
        chunks = inflight_chunks(layout, 0, stages.n_stages)
        total += extra * tokens * stages.n_blocks * chunks
    return total * (1 + cal.ALLOCATOR_FRAGMENTATION)


def compare_point(point: dict) -> Comparison:
    cfg = parse_args(shlex.split(point["args"]))
    hw = make_hardware(point["gpus"], 1, point["card"])
    layout = Layout.from_config(cfg, hw.world_size)
    work = _old_code_workload(point, Workload.from_config(cfg))
    adjustment = _old_code_bytes(point, work, layout)
    memory = estimate_memory(work, layout).total + adjustment
    tokens = estimate_time(work, layout, hw).tokens_per_second_per_gpu
    return Comparison(
        name=point["name"],
        card=point["card"],
        source=point["source"],
        memory_gib=point["memory_gib"],
        memory_estimate_gib=memory / GIB,
        adjustment_gib=adjustment / GIB,
        tokens_per_second=point["tokens_per_second"],
        tokens_estimate=tokens,
        memory_tolerance=point.get("memory_tolerance", MEMORY_TARGET),
        tokens_tolerance=point.get("tokens_tolerance", TOKENS_TARGET),
    )


def markdown_table(rows: list[Comparison]) -> str:
    lines = [
        "| measured step | card | memory est. / measured (GiB) | error | old code (GiB) "
        "| tokens/s/GPU est. / measured | error | source |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        adjustment = f"+{r.adjustment_gib:.2f}" if r.adjustment_gib else "-"
        lines.append(
            f"| {r.name} | {r.card} | {r.memory_estimate_gib:.1f} / {r.memory_gib:.1f} | "
            f"{r.memory_error:+.1%} | {adjustment} | "
            f"{r.tokens_estimate:,.0f} / {r.tokens_per_second:,.0f} | "
            f"{r.tokens_error:+.1%} | {r.source} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv else DEFAULT_POINTS
    print(markdown_table([compare_point(p) for p in load_points(path)]))
    old = load_points(path, superseded=True)
    if old:
        print("\nsuperseded (not calibrated against):\n")
        print(markdown_table([compare_point(p) for p in old]))


if __name__ == "__main__":
    main(sys.argv[1:])
