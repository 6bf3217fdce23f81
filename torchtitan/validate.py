"""Validation: the mean token loss (and perplexity) of held-out data, under any parallel layout.

Every validation reads the same batches, so they are read and tokenized once: the first batch at
start-up (a check that the data holds one), the rest during the first validation, by a loader of
the validator's own without a worker process (the training loader and its checkpointed position
are never touched). ``HeldOutBatches`` keeps them on the host; later validations read no data.
The model parts run forward only, in eval mode and without autograd, under the
same contexts as a training step: context parallel shards inputs, labels and the RoPE caches on the
sequence, loss parallel reads vocab-sharded logits, and under pipeline parallelism the
microbatches go through the stages forward only (``parallel/pipeline_eval.py``), so that only
the last stage computes losses.
The summed token losses are added over the pipeline ranks (only the last stage has any) and the
data- and context-parallel ranks, then divided by the tokens of all data-parallel ranks: the mean
over every validation token, whatever the layout.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from torchtitan.config import JobConfig
from torchtitan.data.errors import DataError
from torchtitan.data.loader import Batch, TextLoader, build_dataloader
from torchtitan.data.splits import about_validation, validation_batch_size, validation_dataset
from torchtitan.data.tokenizer import Tokenizer
from torchtitan.parallel.dims import ParallelDims
from torchtitan.parallel.pipeline import StagePlan
from torchtitan.parallel.pipeline_eval import PipelineForward
from torchtitan.parallel.tensor_parallel import plain_loss

logger = logging.getLogger("torchtitan")

Context = Callable[[], contextlib.AbstractContextManager]


@dataclass(frozen=True)
class ForwardPieces:
    """What the trainer lends the validator to run its model forward only."""

    model_parts: list[nn.Module]
    stage_plan: StagePlan | None  # which pipeline stages the parts are (pp > 1), else None
    summed_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (output, labels) -> sum
    # (inputs, labels, positions) -> a context of this rank's (inputs, labels, model kwargs)
    batch_inputs: Callable[..., contextlib.AbstractContextManager]
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
        try:  # a mistake in the data is named as the validation data's
            self.loader = self._build_loader(tokenizer)
            self.limit = None if cfg.validation.steps == -1 else cfg.validation.steps
            self.batches = HeldOutBatches(self.loader, self.limit)
            self._check_one_batch()
        except DataError as e:
            raise about_validation(e) from None
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

    def _build_loader(self, tokenizer: Tokenizer) -> TextLoader:
        cfg, dims = self.cfg, self.dims
        return build_dataloader(
            validation_dataset(cfg),
            tokenizer,
            seq_len=cfg.training.seq_len,
            local_batch_size=self.local_batch_size,
            dp_rank=dims.dp_rank if dist.is_initialized() else 0,
            dp_world_size=dims.dp_degree,
            infinite=False,  # -1 steps = one pass; more steps than batches stop at the end
            text_field=cfg.training.text_field,
            num_workers=0,  # it reads the data once: a worker process would only cost its start
            pin_memory=False,
            join_documents=cfg.training.join_documents,
            with_positions=True,
        )

    def should_run(self, step: int, last_step: bool) -> bool:
        return step % self.cfg.validation.freq == 0 or last_step

    @torch.no_grad()
    def run(self) -> dict[str, float]:
        """Validate the current weights; -> ``val_loss``, ``val_perplexity``, ``val_tokens``,
        ``val_batches`` and ``val_seconds``, the same on every rank."""
        start = time.perf_counter()
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        batches = 0
        with _eval_mode(self.pieces.model_parts):
            for batch in self.batches:
                on_device = (t.to(self.device, non_blocking=True) for t in batch)
                total += self._summed_loss(*on_device)
                batches += 1
        self._warn_if_short(batches)
        tokens = batches * self.local_batch_size * self.cfg.training.seq_len * self.dims.dp_degree
        loss = self._sum_over_ranks(total).item() / tokens
        return {
            "val_loss": loss,
            "val_perplexity": math.exp(min(loss, 700.0)),  # exp overflows a float past ~709
            "val_tokens": tokens,
            "val_batches": batches,
            "val_seconds": time.perf_counter() - start,
        }

    def _summed_loss(self, *batch: torch.Tensor) -> torch.Tensor:
        """This rank's summed token loss of one batch (0 on pipeline ranks without the last
        stage; a context-parallel rank's share of the sequence)."""
        p = self.pieces
        if self.pipeline is not None:
            return self._pipelined_summed_loss(*batch)
        (model,) = p.model_parts
        with p.batch_inputs(*batch) as (inputs, labels, kwargs):
            with p.autocast():
                output = model(inputs, **kwargs)
            with p.loss_context():
                return plain_loss(p.summed_loss(output, labels)).float()

    def _pipelined_summed_loss(self, *batch: torch.Tensor) -> torch.Tensor:
        p = self.pieces
        size = self.cfg.parallelism.pipeline_parallel_microbatch_size
        with p.batch_inputs(*batch) as (inputs, labels, kwargs), p.autocast():
            targets = labels.split(size)
            microbatch_kwargs = split_kwargs(kwargs, size, len(targets))

            def stage_loss(output: torch.Tensor, index: int) -> torch.Tensor:
                with p.loss_context():
                    return plain_loss(p.summed_loss(output, targets[index])).float()

            microbatches = list(inputs.split(size))
            return self.pipeline.summed_loss(microbatches, stage_loss, microbatch_kwargs)

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
        (reads only as far as one batch of every data-parallel rank, and keeps it)."""
        if not self.batches.read_first():
            dataset = self.loader.dataset
            raise DataError(
                f"validation dataset {dataset.source.name} holds less than one batch: "
                f"{self.dims.dp_degree} data-parallel ranks x {self.local_batch_size} samples of "
                f"{self.cfg.training.seq_len + 1} tokens; use more data or a smaller "
                "--validation.local_batch_size"
            )

    def _warn_if_short(self, batches: int) -> None:
        name, limit = self.loader.dataset.source.name, self.limit
        if limit is not None and batches < limit and not self._warned_short:
            self._warned_short = True
            logger.warning(
                "validation dataset %s has only %d batches; validating on those, not "
                "validation.steps=%d",
                name,
                batches,
                limit,
            )


def split_kwargs(kwargs: dict, size: int, count: int) -> list[dict]:
    """Model kwargs per microbatch of ``size`` samples: tensors split on the batch dim, other
    values (a context-parallel ``SequenceShard``) shared."""
    split = {
        key: value.split(size) if isinstance(value, torch.Tensor) else [value] * count
        for key, value in kwargs.items()
    }
    return [{key: parts[i] for key, parts in split.items()} for i in range(count)]


class HeldOutBatches:
    """The validation batches: read from the loader on the first pass, then kept on the host.

    A batch is kept as its token windows [B, T + 1] in int32 (the labels are the inputs shifted
    by one, ``data/text.py``), a quarter of the memory of the loader's two int64 tensors, and
    its int32 document positions.
    """

    def __init__(self, loader: TextLoader, limit: int | None):
        self.limit = limit  # batches to keep; None = all of them
        self.windows: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._unread: Iterator[Batch] | None = iter(loader)  # None once all are kept

    def read_first(self) -> bool:
        """Read the first batch; -> whether the data holds one."""
        return next(iter(self), None) is not None

    def __iter__(self) -> Iterator[Batch]:
        for windows, positions in self.windows:
            yield _unpack(windows, positions)
        while self._unread is not None:
            batch = next(self._unread, None)
            if batch is None:
                self._all_kept()
                break
            self.windows.append((_pack(batch.inputs, batch.labels), batch.positions))
            if len(self.windows) == self.limit:
                self._all_kept()
            yield _unpack(*self.windows[-1])

    def _all_kept(self) -> None:
        self._unread = None
        size = sum(w.nbytes + p.nbytes for w, p in self.windows)
        logger.info(
            "validation: %d batches kept in host memory for the next validations (%.1f MB)",
            len(self.windows),
            size / 1e6,
        )


def _pack(inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if not torch.equal(inputs[:, 1:], labels[:, :-1]):
        raise ValueError("validation labels are not the inputs shifted by one; keep both tensors")
    return torch.cat([inputs, labels[:, -1:]], dim=1).to(torch.int32)


def _unpack(windows: torch.Tensor, positions: torch.Tensor) -> Batch:
    tokens = windows.long()
    return Batch(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), positions)


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
