"""Worker of test_checkpoint_dist.py (4 processes, gloo): save under one layout, load under another.

1. FSDP4 (1-D mesh of 4): train, async-save steps 1 and 2; record the full (gathered) model and
   optimizer states and the next global batch.
2. FSDP2 x TP2, fresh weights: ``load()`` must resume at step 2 with the same full states, lr,
   train state and the same next global batch (the data state is layout-independent).
3. Truncate one rank's shard of step 2: every rank must fall back to step 1 together.
4. One rank's write of step 3 fails for space: every rank raises the same line, and the partial
   folder is removed.

Prints ``CHECKPOINT-DIST OK`` on rank 0 at the end. Usage: torchrun ... checkpoint_worker.py DIR
"""

import errno
import logging
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint.filesystem as dcp_files
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from torchtitan.checkpoint import CheckpointError, CheckpointManager, TrainState
from torchtitan.config import ASSETS, Checkpoint, JobConfig
from torchtitan.data import Tokenizer, build_dataloader
from torchtitan.loss import loss_context
from torchtitan.models.llama3 import ModelArgs, Transformer
from torchtitan.models.llama3.parallelize import LLAMA3
from torchtitan.optim import build_lr_scheduler, build_optimizer
from torchtitan.parallel.compose import parallelize
from torchtitan.parallel.dims import ParallelDims

SEQ_LEN = 16
GLOBAL_BATCH = 8
ARGS = ModelArgs(dim=64, n_layers=2, n_heads=4, vocab_size=4096, multiple_of=32, max_seq_len=16)
FULL = StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True)


class Run:
    def __init__(self, tp: int, seed: int, tokenizer: Tokenizer):
        cfg = JobConfig()
        cfg.parallelism.tensor_parallel_degree = tp
        cfg.training.seq_len = SEQ_LEN
        self.dims = ParallelDims.from_config(cfg.parallelism, dist.get_world_size())
        self.dims.build_mesh("cpu")
        with torch.device("meta"):
            self.model = Transformer(ARGS)
        parallelize(self.model, LLAMA3, self.dims, cfg, "cpu")
        self.model.to_empty(device="cpu")
        torch.manual_seed(seed)
        self.model.init_weights()
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optimizer, "cpu")
        self.scheduler = build_lr_scheduler(self.optimizer, 100, cfg.lr_scheduler)
        dp = self.dims.dp_degree
        self.loader = build_dataloader(
            "sample", tokenizer, SEQ_LEN, GLOBAL_BATCH // dp, self.dims.dp_rank, dp
        )
        self.data = iter(self.loader)
        self.train_state = TrainState()
        self.loss_parallel = tp > 1

    def manager(self, folder: str, **options) -> CheckpointManager:
        return CheckpointManager(
            Checkpoint(enable=True, interval=1, **options),
            folder,
            model_parts=[self.model],
            optimizers=[self.optimizer],
            lr_schedulers=[self.scheduler],
            dataloader=self.loader,
            train_state=self.train_state,
        )

    def train_step(self) -> None:
        inputs, labels = next(self.data)
        with loss_context(self.loss_parallel):
            logits = self.model(inputs)
            F.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.train_state.step += 1

    def full_state(self) -> dict[str, object]:
        state = {f"model.{k}": v for k, v in get_model_state_dict(self.model, options=FULL).items()}
        optim = get_optimizer_state_dict(self.model, self.optimizer, options=FULL)
        state.update({f"optimizer.{k}": v for k, v in optim.items()})
        return {k: snapshot(v) for k, v in state.items()}

    def next_global_batch(self) -> torch.Tensor:
        """The next global batch in global window order (window i is on dp rank i % dp)."""
        local = next(self.data)[0]
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (self.dims.dp_rank, local))
        by_dp = dict(everyone)  # TP ranks of one dp rank hold the same batch
        dp = self.dims.dp_degree
        return torch.stack([by_dp[r][k] for k in range(GLOBAL_BATCH // dp) for r in range(dp)])


def snapshot(value):
    """A copy: the full state dict shares unsharded tensors (AdamW's step) with the optimizer."""
    if isinstance(value, DTensor):
        return value.full_tensor()
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def assert_same(actual: dict, expected: dict, what: str) -> None:
    assert actual.keys() == expected.keys(), (what, set(actual) ^ set(expected))
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(actual[key], value), (what, key)
        else:
            assert actual[key] == value, (what, key, actual[key], value)


def main() -> None:
    folder = sys.argv[1]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, force=True)
    tokenizer = Tokenizer(ASSETS / "tokenizer.model")

    # 1. FSDP4, async saves.
    a = Run(tp=1, seed=0, tokenizer=tokenizer)
    manager = a.manager(folder, async_mode="async")
    a.train_step()
    manager.save(1)
    step1 = a.full_state()
    a.train_step()
    manager.save(2)
    step2, lr2 = a.full_state(), a.scheduler.get_last_lr()
    manager.close()
    batch3 = a.next_global_batch()
    checkpoints = Path(folder) / "checkpoint"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-1", "step-2"]

    # 2. FSDP2 x TP2 from step 2.
    b = Run(tp=2, seed=1, tokenizer=tokenizer)
    assert b.manager(folder).load() == 2
    assert b.train_state.step == 2
    assert_same(b.full_state(), step2, "step 2 after resharding")
    assert b.scheduler.get_last_lr() == lr2
    b.data = iter(b.loader)
    assert torch.equal(b.next_global_batch(), batch3)

    # 3. A truncated shard of step 2: all ranks fall back to step 1.
    dist.barrier()
    if rank == 0:
        shard = checkpoints / "step-2" / "__1_0.distcp"
        with open(shard, "r+b") as f:
            f.truncate(shard.stat().st_size // 3)
    dist.barrier()
    c = Run(tp=2, seed=2, tokenizer=tokenizer)
    c_manager = c.manager(folder)
    assert c_manager.load() == 1
    assert_same(c.full_state(), step1, "step 1 after falling back")

    # 4. Rank 2's disk fills while step 3 is written: every rank raises the same line, rank 0
    # removes the partial step-3.tmp, the complete steps stay.
    write_item = dcp_files._write_item

    def full_disk(transforms, stream, *args, **kwargs):
        if rank == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_item(transforms, stream, *args, **kwargs)

    dcp_files._write_item = full_disk
    c.train_step()
    try:
        c_manager.save(3)
        raise AssertionError("the save of step 3 did not fail")
    except CheckpointError as e:
        line = str(e)
    lines = [None] * dist.get_world_size()
    dist.all_gather_object(lines, line)
    assert len(set(lines)) == 1 and f"the disk of {checkpoints} is full (" in line, lines
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-1", "step-2"]
    dcp_files._write_item = write_item

    dist.barrier()
    if rank == 0:
        print("CHECKPOINT-DIST OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":  # required: async_save may spawn helpers that re-import __main__
    main()
