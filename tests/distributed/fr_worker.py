"""A tiny "training loop" of collectives for the Flight Recorder tests (run under torchrun).

Every step: maybe a fault, an all_reduce of a float32[1024] "gradient" and an all_gather of a
float32[1] "loss", both on a sub-group 'grads' (so the tightened timeout must reach sub-groups),
then an all_reduce of the step on the default group. The first step runs under the init timeout;
then ``set_train_timeout`` drops every group's timeout to ``--train-timeout``. The loop runs
inside ``dump_on_failure``. Faults come from ``TORCHTITAN_FAULT``.

Writes ``<dump-folder>/timing_<rank>.json``: when each step began, when the loop failed, why.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from torchtitan.config import Comm
from torchtitan.observability import flight_recorder as fr
from torchtitan.observability.fault_injection import maybe_inject


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dump-folder", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--init-timeout", type=int, default=60)
    p.add_argument("--train-timeout", type=int, default=5)
    p.add_argument("--dump-wait", type=int, default=15, help="comm.dump_wait_seconds")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()

    comm = Comm(
        init_timeout_seconds=args.init_timeout,
        train_timeout_seconds=args.train_timeout,
        dump_wait_seconds=args.dump_wait,
    )
    fr.configure_env(comm, args.dump_folder)
    folder = fr.trace_folder(comm, args.dump_folder)
    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend, timeout=timedelta(seconds=comm.init_timeout_seconds))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device, torch.cuda.current_device()) if backend == "nccl" else "cpu"
    grads = dist.new_group(list(range(world)), group_desc="grads")

    timing = {"rank": rank, "step_start": {}, "failed_at": None, "error": None}
    timing_path = Path(args.dump_folder) / f"timing_{rank}.json"
    try:
        with fr.dump_on_failure(folder, enabled=comm.trace_buf_size > 0):
            for step in range(1, args.steps + 1):
                timing["step_start"][step] = time.time()
                # written now too: on NCCL the watchdog may abort the process before `finally`
                timing_path.write_text(json.dumps(timing))
                maybe_inject("delay", step, rank)
                maybe_inject("crash", step, rank)
                grad = torch.full((1024,), float(rank + step), device=device)
                if not maybe_inject("skip_collective", step, rank):
                    dist.all_reduce(grad, group=grads)
                loss = grad[:1].clone()
                gathered = [torch.zeros_like(loss) for _ in range(world)]
                dist.all_gather(gathered, loss, group=grads)
                step_t = torch.tensor([step], device=device)
                dist.all_reduce(step_t)
                step_t.item()  # wait for the step's collectives, like a logged loss would
                if step == 1:
                    fr.set_train_timeout(comm.train_timeout_seconds)
    except BaseException as e:
        timing["failed_at"] = time.time()
        timing["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        raise
    finally:
        timing_path.write_text(json.dumps(timing))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
