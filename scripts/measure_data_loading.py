"""Measure what the data loader costs the training loop, on CPU (numbers quoted in docs/data.md).

1. In the training process (``--training.data_workers 0``): the wall and CPU time of one
   ``next()``, i.e. reading, tokenizing and packing ``dp`` windows per local sample.
2. With the worker (pinned memory on CUDA): the time ``next()`` blocks when the loop spends
   ``--step_seconds`` between batches (a sleep stands in for a GPU step, whose host thread
   mostly waits on the GPU too). On a busy CPU-only machine this mostly measures how long the
   worker waits for a core.

    python scripts/measure_data_loading.py --seq_len 8192 --local_batch_size 1 --dp 4
"""

import argparse
import statistics
import time

import torch

from torchtitan.config import ASSETS
from torchtitan.data import Tokenizer, build_dataloader


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="sample")
    parser.add_argument("--tokenizer", default=str(ASSETS / "tokenizer.model"))
    parser.add_argument("--seq_len", type=int, default=8192)
    parser.add_argument("--local_batch_size", type=int, default=1)
    parser.add_argument("--dp", type=int, default=4, help="data-parallel degree (rank 0 is timed)")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--step_seconds", type=float, default=0.88, help="8B FSDP4 on H200")
    return parser.parse_args()


def loader(args: argparse.Namespace, workers: int):
    return build_dataloader(
        args.dataset,
        Tokenizer(args.tokenizer),
        args.seq_len,
        args.local_batch_size,
        dp_rank=0,
        dp_world_size=args.dp,
        num_workers=workers,
    )


def in_process(args: argparse.Namespace) -> None:
    batches = iter(loader(args, workers=0))
    next(batches)  # opening the dataset is not per-batch work
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.batches):
        next(batches)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tokens = args.batches * args.local_batch_size * args.dp * (args.seq_len + 1)
    print(
        f"in the training process: {1e3 * wall / args.batches:.1f} ms wall, "
        f"{1e3 * cpu / args.batches:.1f} ms CPU per batch; "
        f"{tokens / cpu / 1e6:.2f} M tokens tokenized per CPU second"
    )


def with_worker(args: argparse.Namespace) -> None:
    batches = iter(loader(args, workers=1))
    next(batches)
    waits = []
    for _ in range(args.batches):
        time.sleep(args.step_seconds)
        start = time.perf_counter()
        inputs, _ = next(batches)
        waits.append(time.perf_counter() - start)
        if torch.cuda.is_available():
            inputs.to("cuda", non_blocking=True)
    mean = statistics.mean(waits)
    print(
        f"with the worker: next() blocks {1e6 * mean:.0f} us on average "
        f"(median {1e6 * statistics.median(waits):.0f}, max {1e6 * max(waits):.0f}) = "
        f"{100 * mean / (args.step_seconds + mean):.3f}% of a {args.step_seconds:g} s step"
    )


if __name__ == "__main__":
    arguments = parse()
    in_process(arguments)
    with_worker(arguments)
