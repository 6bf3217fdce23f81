"""A model of a training step (per-GPU peak memory and step time) and the layout search of
``python -m torchtitan.plan``. See docs/planning.md.

    work = Workload.from_config(cfg)                      # model, sequence, batch, precision
    layout = Layout.from_config(cfg, world_size)          # degrees, pipeline, AC, local batch
    estimate_memory(work, layout).describe()              # "63.5 GiB (activations 23.0, ...)"
    estimate_time(work, layout, make_hardware(4, card="H200")).tokens_per_second_per_gpu
    search(cfg, work, hardware).fits                      # every layout that fits, best first
"""

from torchtitan.planning.hardware import CARDS, Card, Hardware, make_hardware
from torchtitan.planning.layout import Layout, Workload
from torchtitan.planning.memory import MemoryEstimate, estimate_memory
from torchtitan.planning.search import Plan, search
from torchtitan.planning.timing import TimeEstimate, estimate_time

__all__ = [
    "CARDS",
    "Card",
    "Hardware",
    "Layout",
    "MemoryEstimate",
    "Plan",
    "TimeEstimate",
    "Workload",
    "estimate_memory",
    "estimate_time",
    "make_hardware",
    "search",
]
