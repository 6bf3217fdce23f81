"""The benchmark scripts' one timer (the median of CUDA-event timings of a callable) and one
memory probe (the peak a call allocates above what was allocated before it)."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable

import torch

GPU_SLEEP_CYCLES = 200_000_000  # about 100 ms at an H100's or H200's clock


def median_ms(fn, iters: int, warmup: int = 0, queued: bool = False) -> float:
    """Median milliseconds of ``iters`` calls of ``fn`` after ``warmup`` untimed ones (CUDA
    events around each call, synchronized after it). ``queued``: each call queued behind a
    100 ms GPU sleep that outlasts the host's launches, so only the kernels' time counts."""
    times = []
    for _ in range(warmup + iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if queued:
            torch.cuda._sleep(GPU_SLEEP_CYCLES)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[warmup:])


def peak_gib(fn) -> float:
    """GiB that one call of ``fn`` allocates at its peak above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def print_bandwidths(variants: list[tuple[str, Callable]], args: tuple, moved: int, iters: int):
    """For each (name, fn): the median kernel time of ``fn(*args)`` (queued, after 5 warm-up
    calls) and the bandwidth ``moved`` bytes per call would need at it."""
    width = max(len(name) for name, _ in variants)
    for name, fn in variants:
        ms = median_ms(functools.partial(fn, *args), iters, warmup=5, queued=True)
        print(f"{name:<{width}} {ms:.3f} ms  {moved / ms / 1e9:.2f} TB/s")
