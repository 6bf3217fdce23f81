"""Text output of the planner: a table of the best layouts, their run_train.sh commands, and
(with --explain) every rejected layout with its reason."""

from __future__ import annotations

from torchtitan.config import JobConfig
from torchtitan.planning.command import planned_config, run_train_command
from torchtitan.planning.float8 import linear_features
from torchtitan.planning.hardware import GIB, Hardware
from torchtitan.planning.layout import Workload
from torchtitan.planning.moe import describe_params
from torchtitan.planning.search import Candidate, Plan, usable_bytes

COLUMNS = ("#", "layout", "AC", "pipeline", "batch", "peak memory", "tokens/s/GPU", "MFU")


def _row(index: str, c: Candidate) -> tuple[str, ...]:
    lay = c.layout
    batch = f"{lay.local_batch_size}"
    mem = f"{c.memory.total_gib:.1f} GiB" if c.memory else "-"
    tps = f"{c.tokens_per_second:,.0f}" if c.time else "-"
    mfu = f"{c.time.mfu:.0%}" if c.time else "-"
    return (index, lay.describe(), lay.describe_ac(), lay.describe_pp(), batch, mem, tps, mfu)


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    lines = []
    for r in [COLUMNS, *rows]:
        cells = [
            cell.rjust(w) if i >= 4 else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def describe_hardware(hw: Hardware) -> str:
    c = hw.card
    gpus = f"{hw.gpus_per_node} GPU" + ("s" if hw.gpus_per_node > 1 else "")
    where = gpus if hw.nodes == 1 else f"{hw.nodes} nodes x {gpus}"
    return (
        f"{where} {c.name} ({c.memory_gib:.1f} GiB, {usable_bytes(hw) / GIB:.1f} usable; "
        f"{c.tflops:.0f} TFLOP/s bf16; NVLink {c.nvlink_gbps:.0f} GB/s, network "
        f"{c.network_gbps:.0f} GB/s per GPU)"
    )


def header(plan: Plan, flavor: str, model_name: str = "llama3") -> str:
    w = plan.workload
    family = "Llama 3" if model_name == "llama3" else model_name
    line = (
        f"{family} {flavor}, seq {w.seq_len}, global batch {plan.global_batch} samples "
        f"({plan.global_batch * w.seq_len:,} tokens) per step, "
        f"on {describe_hardware(plan.hardware)}"
    )
    if w.shape.experts:
        s = w.shape
        line += (
            f"\nparameters: {describe_params(w.model)} ({s.experts} experts, top {s.top_k}, "
            "in every block); memory counts every expert, compute the active ones"
        )
    return line + (f"\n{describe_float8(w)}" if w.float8 else "")


def describe_all_to_all(c: Candidate) -> str:
    """What the expert-parallel token exchange of a MoE layout sends, after its label."""
    if c.layout.ep == 1:
        return "none (no expert parallelism)"
    seconds = c.time.parts.get("expert all-to-all", 0.0)
    return (
        f"{c.time.all_to_all_bytes / GIB:.2f} GiB per GPU per step (EP{c.layout.ep}, "
        f"~{seconds * 1e3:.0f} ms exposed)"
    )


def describe_float8(work: Workload) -> str:
    """Which linears run in float8 (the trainer's rule), and what moves in float8."""
    setting, names = work.float8, list(linear_features(work.shape))
    on = [n for n in names if n in work.float8_linears]
    off = [n for n in names if n not in work.float8_linears]
    parts = [f"{', '.join(on) or 'no linear'} in float8"]
    if off:
        parts.append(f"{', '.join(off)} in bf16")
    if setting.fsdp_float8_all_gather and setting.recipe == "tensorwise":
        parts.append("FSDP all-gathers their weights in float8")
    return f"float8 {setting.recipe}: {'; '.join(parts)} (MFU against the bf16 peak)"


def format_plan(
    plan: Plan,
    cfg: JobConfig,
    config_file: str,
    top: int = 5,
    explain: bool = False,
    current: Candidate | None = None,
) -> str:
    out = [header(plan, cfg.model.flavor, cfg.model.name), ""]
    n_valid = len(plan.fits) + sum(1 for c in plan.rejected if c.memory)
    out.append(
        f"{len(plan.fits)} of {n_valid} valid layouts fit "
        f"({sum(1 for c in plan.rejected if not c.memory)} more are refused by the trainer's "
        "checks; --explain lists why). Estimates assume compiled blocks and loss."
    )
    if plan.fits:
        best = plan.fits[:top]
        out += ["", table([_row(str(i + 1), c) for i, c in enumerate(best)]), ""]
        for i, c in enumerate(best):
            job = planned_config(cfg, c.layout, plan.global_batch)
            out.append(f"{i + 1}: {run_train_command(job, config_file, plan.hardware)}")
        out += ["", "largest parts of #1: " + plan.fits[0].memory.describe(4)]
        if plan.workload.shape.experts:
            out.append(f"expert all-to-all of #1: {describe_all_to_all(plan.fits[0])}")
    else:
        out += ["", "nothing fits; the layouts closest to fitting:"]
        closest = sorted((c for c in plan.rejected if c.memory), key=lambda c: c.memory.total)
        out.append(table([_row("-", c) for c in closest[:top]]))
    if current is not None:
        out += ["", _describe_current(current)]
    if explain:
        out += ["", "rejected layouts:"]
        out += [
            f"  {c.layout.describe():>14} {_rejected_detail(c)}: {c.reason}" for c in plan.rejected
        ]
    return "\n".join(out)


def _rejected_detail(c: Candidate) -> str:
    lay = c.layout
    ac = lay.describe_ac() if c.memory else "any AC"
    return f"batch {lay.local_batch_size}, {ac}, pipeline {lay.describe_pp()}"


def _describe_current(c: Candidate) -> str:
    if c.reason and not c.memory:
        return f"the config as given: refused by the trainer: {c.reason}"
    verdict = f"does not fit: {c.reason}" if c.reason else "fits"
    return (
        f"the config as given ({c.layout.describe()}, AC {c.layout.describe_ac()}, batch "
        f"{c.layout.local_batch_size}): {c.memory.describe()}, "
        f"~{c.tokens_per_second:,.0f} tokens/s/GPU; {verdict}"
    )


def nothing_fits(plan: Plan) -> str:
    """The one line ``plan`` ends with when no layout fits (stderr, exit 1)."""
    hw, usable = plan.hardware, usable_bytes(plan.hardware) / GIB
    closest = min(
        (c for c in plan.rejected if c.memory), key=lambda c: c.memory.total, default=None
    )
    if closest is None:
        return (
            f"no layout of {hw.world_size} GPU(s) passes the trainer's checks (--explain lists "
            "why); change the GPU count or the model's shape"
        )
    return (
        f"no layout fits in {usable:.1f} GiB per GPU: the closest, {closest.layout.describe()} "
        f"with AC {closest.layout.describe_ac()} and batch {closest.layout.local_batch_size}, "
        f"needs {closest.memory.total_gib:.1f} GiB; use more GPUs (--gpus, --nodes) or a card "
        "with more memory, or lower --training.seq_len or --training.global_batch_size"
    )
