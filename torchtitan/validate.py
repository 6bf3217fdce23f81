"""Validation: the mean token loss (and perplexity) of held-out data, under any parallel layout.

Every validation reads the same batches: the validation loader is rewound to the start of its
data each time (it is a loader of its own; the training loader and its checkpointed position are
never touched). The model parts run forward only, in eval mode and without autograd, under the
same contexts as a training step: context parallel shards inputs, labels and the RoPE caches on
the sequence, loss parallel reads vocab-sharded logits, and under pipeline parallelism the
microbatches go through the stages forward only (``parallel/pipeline_eval.py``), so that only
the last stage computes losses.
The summed token losses are added over the pipeline ranks (only the last stage has any) and the
data- and context-parallel ranks, then divided by the tokens of all data-parallel ranks: the mean
over every validation token, whatever the layout.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from torchtitan.config import JobConfig
from torchtitan.data.errors import DataError
from torchtitan.data.loader import build_dataloader
from torchtitan.data.splits import validation_batch_size, validation_dataset
from torchtitan.data.tokenizer import Tokenizer
from torchtitan.parallel.dims import ParallelDims
from torchtitan.parallel.pipeline import StagePlan
from torchtitan.parallel.pipeline_eval import PipelineForward

logger = logging.getLogger("torchtitan")

Context = Callable[[], contextlib.AbstractContextManager]


@dataclass(frozen=True)
class ForwardPieces:
    """What the trainer lends the validator to run its model forward only."""

    model_parts: list[nn.Module]
    stage_plan: StagePlan | None  # which pipeline stages the parts are (pp > 1), else None
    summed_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (output, labels) -> sum
    cp_context: Callable[[torch.Tensor, torch.Tensor], contextlib.AbstractContextManager]
    loss_context: Context
    autocast: Context


class Validator:
    """Runs ``validation.steps`` batches of the validation data; ``run()`` -> metrics."""

    def __init__(
        self,
        cfg: JobConfig,
        tokenizer: Tokenizer,
        dims: ParallelDims,
        device: torch.device,
        pieces: ForwardPieces,
    ):
        self.cfg, self.dims, self.device, self.pieces = cfg, dims, device, pieces
        self.local_batch_size = validation_batch_size(cfg)
        self.loader = build_dataloader(
            validation_dataset(cfg),
            tokenizer,
            seq_len=cfg.training.seq_len,
            local_batch_size=self.local_batch_size,
            dp_rank=dims.dp_rank if dist.is_initialized() else 0,
            dp_world_size=dims.dp_degree,
            infinite=False,  # -1 steps = one pass; more steps than batches stop at the end
            text_field=cfg.training.text_field,
            num_workers=cfg.training.data_workers,
        )
        self.start = self.loader.state_dict()
        self._check_one_batch()
        self.pipeline = self._pipeline_forward() if dims.pp > 1 else None
        self._warned_short = False
        v = cfg.validation
        logger.info(
            "validation data %s; %s of %d x %d tokens per rank every %d steps",
            self.loader.describe(),
            "all batches" if v.steps == -1 else f"{v.steps} batches",
            self.local_batch_size,
            cfg.training.seq_len,
            v.freq,
        )

    def should_run(self, step: int, last_step: bool) -> bool:
        return step % self.cfg.validation.freq == 0 or last_step

    @torch.no_grad()
    def run(self) -> dict[str, float]:
        """Validate the current weights; -> ``val_loss``, ``val_perplexity``, ``val_tokens``,
        ``val_batches`` and ``val_seconds``, the same on every rank."""
        start = time.perf_counter()
        self.loader.load_state_dict(self.start)
        limit = None if self.cfg.validation.steps == -1 else self.cfg.validation.steps
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        batches = 0
        with _eval_mode(self.pieces.model_parts):
            for inputs, labels in itertools.islice(self.loader, limit):
                inputs = inputs.to(self.device, non_blocking=True)
                labels = labels.to(self.device, non_blocking=True)
                total += self._summed_loss(inputs, labels)
                batches += 1
        self._warn_if_short(batches, limit)
        tokens = batches * self.local_batch_size * self.cfg.training.seq_len * self.dims.dp_degree
        loss = self._sum_over_ranks(total).item() / tokens
        return {
            "val_loss": loss,
            "val_perplexity": math.exp(min(loss, 700.0)),  # exp overflows a float past ~709
            "val_tokens": tokens,
            "val_batches": batches,
            "val_seconds": time.perf_counter() - start,
        }

    def _summed_loss(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """This rank's summed token loss of one batch (0 on pipeline ranks without the last
        stage; a context-parallel rank's share of the sequence)."""
        p = self.pieces
        if self.pipeline is not None:
            return self._pipelined_summed_loss(inputs, labels)
        (model,) = p.model_parts
        with p.cp_context(inputs, labels):
            with p.autocast():
                output = model(inputs)
            with p.loss_context():
                return _local(p.summed_loss(output, labels)).float()

    def _pipelined_summed_loss(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        p = self.pieces
        size = self.cfg.parallelism.pipeline_parallel_microbatch_size
        with p.cp_context(inputs, labels), p.autocast():
            targets = labels.split(size)

            def stage_loss(output: torch.Tensor, index: int) -> torch.Tensor:
                with p.loss_context():
                    return _local(p.summed_loss(output, targets[index])).float()

            return self.pipeline.summed_loss(list(inputs.split(size)), stage_loss)

    def _pipeline_forward(self) -> PipelineForward:
        p = self.pieces
        schedule = self.cfg.parallelism.pipeline_parallel_schedule
        group = self.dims.mesh("pp").get_group()
        return PipelineForward(p.model_parts, p.stage_plan, schedule, group, self.device)

    def _sum_over_ranks(self, total: torch.Tensor) -> torch.Tensor:
        if not dist.is_initialized():
            return total
        if self.dims.pp > 1:
            dist.all_reduce(total, group=self.dims.mesh("pp").get_group())
        if self.dims.loss_mesh.size() > 1:
            dist.all_reduce(total, group=self.dims.loss_mesh.get_group())
        return total

    def _check_one_batch(self) -> None:
        """Fail at start-up, not at the first validation, when the data holds no whole batch
        (reads only as far as one batch of every data-parallel rank)."""
        dataset = self.loader.dataset
        got = sum(1 for _ in itertools.islice(dataset.positioned_samples(), self.local_batch_size))
        dataset.load_state_dict(self.start)
        if got < self.local_batch_size:
            raise DataError(
                f"validation dataset {dataset.source.name} holds less than one batch: "
                f"{self.dims.dp_degree} data-parallel ranks x {self.local_batch_size} samples of "
                f"{self.cfg.training.seq_len + 1} tokens; use more data or a smaller "
                "--validation.local_batch_size"
            )

    def _warn_if_short(self, batches: int, limit: int | None) -> None:
        name = self.loader.dataset.source.name
        if limit is not None and batches < limit and not self._warned_short:
            self._warned_short = True
            logger.warning(
                "validation dataset %s has only %d batches; validating on those, not "
                "validation.steps=%d",
                name,
                batches,
                limit,
            )


@contextlib.contextmanager
def _eval_mode(parts: list[nn.Module]):
    """Eval mode for the validation, then back to training mode."""
    for part in parts:
        part.eval()
    try:
        yield
    finally:
        for part in parts:
            part.train()


def _local(loss: torch.Tensor) -> torch.Tensor:
    """Loss parallel returns a DTensor replicated over TP; its value is the same everywhere."""
    return loss.full_tensor() if isinstance(loss, DTensor) else loss
