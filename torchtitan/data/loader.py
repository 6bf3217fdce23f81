"""The data loader: ``(input_ids, labels)`` batches of shape [B, T] of this rank's packed windows,
or ``Batch(inputs, labels, positions)`` with each token's position in its document
(``with_positions``; text.py says how documents are packed).

``TextLoader`` runs a ``TextDataset`` under ``torch.utils.data.DataLoader``. With a worker (the
default on CUDA) reading, tokenization and packing happen in that process, ``PREFETCH_BATCHES``
batches ahead of the training loop, and batches arrive in pinned memory so that the trainer's
``.to(device, non_blocking=True)`` is asynchronous. There is at most one worker: the stream is one
global sequence packed in order (``text.py``), and several workers would each need a share of it,
which would tie the stream position to the worker count.

State: every batch travels with the stream position just after it, so ``state_dict()`` is the
position after the last batch handed out, however far the worker has read ahead. It is the same
plain global position with a worker or without, identical on every rank, and loads under another
data-parallel layout with the same global batch size.
"""

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader, IterableDataset

from torchtitan.data.errors import DataError
from torchtitan.data.sources import resolve_source
from torchtitan.data.text import TextDataset
from torchtitan.data.tokenizer import Tokenizer
from torchtitan.data.worker import worker_init_for

AUTO_WORKERS = -1
PREFETCH_BATCHES = 2


class Batch(NamedTuple):
    inputs: torch.Tensor  # (B, T) token ids
    labels: torch.Tensor  # (B, T) the next token of each input
    positions: torch.Tensor  # (B, T) int32: each input's position in its document


def resolve_workers(requested: int) -> int:
    """``training.data_workers`` -> worker processes: -1 = 1 on CUDA, 0 on CPU."""
    if requested == AUTO_WORKERS:
        return 1 if torch.cuda.is_available() else 0
    if requested not in (0, 1):
        raise DataError(
            f"--training.data_workers {requested}: use -1 (auto), 0 (tokenize in the training "
            "process) or 1 (one worker process); the packed stream is read by one process"
        )
    return requested


class PositionedSamples(IterableDataset):
    """The dataset's samples, each followed by the stream position just after it."""

    def __init__(self, dataset: TextDataset):
        self.dataset = dataset

    def __iter__(self):
        return self.dataset.positioned_samples()


def stack_positioned(samples: list) -> tuple[Batch, dict[str, Any]]:
    inputs, labels, positions, states = zip(*samples)
    return Batch(torch.stack(inputs), torch.stack(labels), torch.stack(positions)), states[-1]


class TextLoader:
    """Batches of a ``TextDataset``; see the module doc. ``iter()`` starts at ``state_dict()``."""

    def __init__(
        self,
        dataset: TextDataset,
        local_batch_size: int,
        num_workers: int,
        pin_memory: bool,
        with_positions: bool = False,
    ):
        self.dataset = dataset
        self.with_positions = with_positions
        self.local_batch_size = local_batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self._position = dataset.state_dict()

    @property
    def windows(self) -> int:
        """Global windows (all ranks) handed out up to the last batch this loader returned."""
        return self._position["windows"]

    def state_dict(self) -> dict[str, Any]:
        return dict(self._position)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Applies to the next ``iter()``. Also takes the ``StatefulDataLoader`` dict that
        checkpoints written before ``TextLoader`` hold (the position is its ``dataset_state``)."""
        position = state_dict.get("dataset_state", state_dict)
        self.dataset.load_state_dict(position)
        self._position = self.dataset.state_dict()

    def __iter__(self) -> Iterator[Batch | tuple[torch.Tensor, torch.Tensor]]:
        self.dataset.load_state_dict(self._position)
        with_workers = self.num_workers > 0
        loader = DataLoader(
            PositionedSamples(self.dataset),
            batch_size=self.local_batch_size,
            num_workers=self.num_workers,
            collate_fn=stack_positioned,
            drop_last=True,
            pin_memory=self.pin_memory,
            prefetch_factor=PREFETCH_BATCHES if with_workers else None,
            worker_init_fn=worker_init_for(os.getpid()) if with_workers else None,
        )
        # Started now, so that the worker reads ahead while the trainer finishes setting up.
        return self._hand_out(iter(loader))

    def describe(self) -> str:
        """What the data is and how large, for the start-up log (no full pass over it)."""
        return describe_dataset(self.dataset)

    def _hand_out(self, batches: Iterator) -> Iterator[Batch | tuple[torch.Tensor, torch.Tensor]]:
        for batch, position in batches:
            self._position = position
            yield batch if self.with_positions else (batch.inputs, batch.labels)


def describe_dataset(dataset: TextDataset) -> str:
    """Documents and bytes of local data (the text of a split's rows, else the files' size);
    streamed hub data is not counted."""
    source, documents = dataset.source, dataset.documents
    if source.streaming:
        return (
            f"{source.name}: streamed from the Hugging Face hub ({source.hub_id}, split "
            f"{source.split}), size unknown"
        )
    start, stop = documents.start_cursor, documents.stop
    if source.rows is None:
        size = sum(Path(f).stat().st_size for f in source.data_files)
    else:
        texts = documents.dataset[start:stop][source.text_field]
        size = sum(len(text.encode()) for text in texts if text)
    return f"{source.name}: {stop - start:,} documents, {size / 1e6:,.1f} MB of text"


def build_dataloader(
    dataset_spec: str,
    tokenizer: Tokenizer,
    seq_len: int,
    local_batch_size: int,
    dp_rank: int,
    dp_world_size: int,
    infinite: bool = True,
    text_field: str = "text",
    num_workers: int = AUTO_WORKERS,
    pin_memory: bool | None = None,
    join_documents: int = 1,
    with_positions: bool = False,
) -> TextLoader:
    """Loader over this rank's share of the packed token windows.

    ``num_workers``: see ``resolve_workers``. ``pin_memory``: None = when CUDA is available (the
    trainer then trains on CUDA). ``with_positions``: hand out ``Batch`` triples.
    """
    source = resolve_source(dataset_spec, text_field)
    dataset = TextDataset(
        source, tokenizer, seq_len, dp_rank, dp_world_size, infinite, join_documents
    )
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    workers = resolve_workers(num_workers)
    return TextLoader(dataset, local_batch_size, workers, pin_memory, with_positions)
