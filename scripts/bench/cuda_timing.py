"""The benchmark scripts' one timer: the median of CUDA-event timings of a callable."""

from __future__ import annotations

import statistics

import torch


def median_ms(fn, iters: int, warmup: int = 0) -> float:
    """Median milliseconds of ``iters`` calls of ``fn`` after ``warmup`` untimed ones (CUDA
    events around each call, synchronized after it)."""
    times = []
    for _ in range(warmup + iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[warmup:])
