"""GPU time of the gradient norm, the clipping and the optimizer step inside a training run.

Put this folder first on ``PYTHONPATH`` and set ``STEP_TIMING=1``: Python imports
``sitecustomize`` at start-up, before the trainer, so both frameworks' calls go through the
wrappers below (ours and the reference's both call these torch functions). Each call is timed
with CUDA events on the current stream (the GPU time from the first kernel it queues to the last,
including gaps where the GPU waited for the host); at the ``STEP_TIMING_REPORT``-th optimizer step
(default 30) rank 0 prints the median of the calls after ``STEP_TIMING_SKIP`` (default 10) to
stderr. The events add no host-device sync until then.
"""

import os

if os.environ.get("STEP_TIMING") == "1":
    import statistics
    import sys

    import torch
    import torch.nn.utils as nn_utils

    SKIP = int(os.environ.get("STEP_TIMING_SKIP", "10"))
    REPORT = int(os.environ.get("STEP_TIMING_REPORT", "30"))
    events: dict[str, list] = {}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            if not torch.cuda.is_available():
                return fn(*args, **kwargs)
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            events.setdefault(name, []).append((start, end))
            if name == "optimizer.step" and len(events[name]) == REPORT:
                report()
            return out

        return wrapper

    def report():
        if os.environ.get("RANK", "0") != "0":
            return
        torch.cuda.synchronize()
        for name, pairs in events.items():
            ms = [s.elapsed_time(e) for s, e in pairs[SKIP:]]
            if ms:
                print(
                    f"STEP_TIMING {name}: median {statistics.median(ms):.2f} ms over {len(ms)} "
                    f"calls (min {min(ms):.2f}, max {max(ms):.2f})",
                    file=sys.stderr,
                    flush=True,
                )

    nn_utils.get_total_norm = timed("get_total_norm", nn_utils.get_total_norm)
    nn_utils.clip_grads_with_norm_ = timed("clip_grads_with_norm_", nn_utils.clip_grads_with_norm_)
    torch.optim.AdamW.step = timed("optimizer.step", torch.optim.AdamW.step)
