"""How to split a job over some GPUs, and will it fit: ``python -m torchtitan.plan``.

Takes the trainer's config file and overrides (``--job.config_file FILE --section.key value``)
plus the hardware, enumerates every layout the trainer accepts, and prints the fastest ones that
fit with their estimated peak memory, tokens/s per GPU and ``run_train.sh`` command line.
Exit status: 0 when a layout fits, 1 when none does (the closest are printed, and one line on
stderr says what to change), 2 for a bad argument.
"""

from __future__ import annotations

import sys

from torchtitan.config import ConfigError, parse_args
from torchtitan.config.parse import take_flags
from torchtitan.planning.hardware import CARDS, HardwareError, make_hardware
from torchtitan.planning.layout import Layout, Workload
from torchtitan.planning.report import format_plan, nothing_fits
from torchtitan.planning.search import Candidate, Plan, check_job, evaluate, search

FLAGS = {
    "gpus": (int, "GPUs per node (as NGPU of run_train.sh); required"),
    "nodes": (int, "nodes (default 1); the world size is gpus x nodes"),
    "card": (str, f"one of {', '.join(CARDS)}; or give the four numbers below"),
    "memory-gib": (float, "custom card: memory per GPU in GiB"),
    "tflops": (float, "custom card: dense bf16 TFLOP/s per GPU"),
    "nvlink-gbps": (float, "custom card: GB/s per GPU to GPUs of the same node"),
    "network-gbps": (float, "custom card: GB/s per GPU to other nodes"),
    "hbm-gbps": (float, "memory bandwidth in GB/s (optional; bounds the optimizer step)"),
    "top": (int, "how many layouts to show (default 5)"),
    "explain": (bool, "also list every rejected layout and why"),
}

USAGE = """usage: python -m torchtitan.plan --gpus N [--nodes K] --card NAME [--top N] [--explain]
                                [--job.config_file FILE] [--section.key VALUE ...]

Config options are the trainer's (python -m torchtitan.train --help). Planner options:
""" + "\n".join(f"  --{name:<13} {doc}" for name, (_, doc) in FLAGS.items())


def _hardware(options: dict):
    if "gpus" not in options:
        raise HardwareError("give the number of GPUs per node: --gpus N")
    custom = {
        k.replace("-", "_"): options.get(k)
        for k in ("memory-gib", "tflops", "nvlink-gbps", "network-gbps", "hbm-gbps")
    }
    return make_hardware(options["gpus"], options.get("nodes", 1), options.get("card"), **custom)


def _current(cfg, plan, hw) -> Candidate:
    """The config's own layout, estimated with its own compile settings."""
    layout = Layout.from_config(cfg, hw.world_size)
    reason = check_job(cfg, layout, hw.world_size, plan.workload.model)
    if reason:
        return Candidate(layout, reason=reason)
    return evaluate(Workload.from_config(cfg), layout, hw)


def run(argv: list[str]) -> tuple[str, Plan]:
    options, config_args = take_flags(argv, {name: kind for name, (kind, _) in FLAGS.items()})
    hw = _hardware(options)
    cfg = parse_args(config_args)
    if options.get("top", 5) < 1:
        raise HardwareError(f"--top must be positive; got {options['top']}")
    work = Workload.from_config(cfg).with_(compile=True, compile_loss=True)
    plan = search(cfg, work, hw)
    text = format_plan(
        plan,
        cfg,
        cfg.job.config_file,
        top=options.get("top", 5),
        explain=options.get("explain", False),
        current=_current(cfg, plan, hw),
    )
    return text, plan


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(USAGE)
        return 0
    try:
        text, plan = run(argv)
        print(text, flush=True)
    except BrokenPipeError:  # e.g. piped into head
        sys.stdout = None
        return 0
    except (ConfigError, HardwareError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not plan.fits:  # the table above shows the closest layouts; a script must not go on
        print(f"error: {nothing_fits(plan)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
