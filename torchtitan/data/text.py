"""Text datasets: documents from a source (``sources.py``), packed into fixed-length token windows.

Packing: every document becomes ``[BOS] + tokens + [EOS]``; documents are concatenated, across
epochs too, into one global token stream, which is cut into non-overlapping windows of
``seq_len + 1`` tokens (stride ``seq_len + 1``). A window ``w`` gives the sample
``(w[:-1], w[1:])``, so the last label of a window is never an input; that costs one token in
``seq_len + 1`` and keeps windows independent.

Document positions: each input token's position in its document, 0 where a document starts and
at the start of every window (a document cut by a window boundary continues as a new one). The
label of a document's last token (EOS) is the next document's BOS: it is trained, predicted from
the ending document alone under document masking. ``join_documents = k`` treats k consecutive
source documents as one (the tokens are unchanged, BOS/EOS included; only the positions run on),
which sets the mean document length that document masking sees.

Data parallelism: the stream is consumed in rounds of ``dp_world_size`` consecutive windows, and
rank ``r`` takes the ``r``-th window of each round, i.e. global window ``i`` goes to rank
``i % dp_world_size``. One global batch is thus a contiguous range of global windows whatever the
layout, and the state saved after each sample is the position after the whole round, identical on
all ranks. That makes the state layout-independent: it can be loaded with another
``dp_world_size`` and the global sample sequence continues where it stopped. The price is that
every rank reads and tokenizes the whole stream; on CUDA the loader (``loader.py``) does that in
a worker process, off the training loop's path (docs/data.md gives the cost).

State: epoch, a cursor to the current document (its row index for local data, or the Hugging
Face ``IterableDataset.state_dict()`` taken just before it for streamed data), the number of
the document's tokens already consumed, the number of global windows emitted, and the
document's index in its epoch (for ``join_documents``). Resuming re-tokenizes only the current
document.

When the source is exhausted it is read again from the start (logged as re-looping, epoch counter
in the state); with ``infinite=False`` iteration stops instead, dropping the trailing tokens that
don't fill a whole round so that all ranks stop after the same number of samples.
"""

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset

from torchtitan.data import json_lines
from torchtitan.data.errors import DataError
from torchtitan.data.sources import DatasetSource, missing_field_error, resolve_source
from torchtitan.data.tokenizer import Tokenizer
from torchtitan.paths import shown

logger = logging.getLogger(__name__)

ROWS_PER_READ = 256


def load_hf_dataset(source: DatasetSource):
    import datasets

    if source.hub_id is not None:
        return datasets.load_dataset(
            source.hub_id, name=source.hub_config, split=source.split, streaming=True
        )
    options = {"sample_by": "paragraph"} if source.builder == "text" else {}
    try:
        return datasets.load_dataset(
            source.builder,
            data_files=list(source.data_files),
            split=source.split,
            streaming=source.streaming,
            **options,
        )
    except Exception as error:  # HF raises many kinds; the user needs the file and what is wrong
        raise DataError(load_failure(source, error)) from error


def load_failure(source: DatasetSource, error: BaseException) -> str:
    """One line: the line of a JSON file that is not a record (the file named once), else the
    first cause in ``error``'s chain that the datasets library did not raise (its own say "An
    error occurred while generating the dataset")."""
    if source.builder == "json":
        bad = json_lines.first_bad_line(list(source.data_files))
        if bad is not None:
            return f"dataset file {shown(bad.path)}, line {bad.line_number}: {bad.problem}"
    return f"could not load dataset {source.name}: {first_cause(error)}"


def first_cause(error: BaseException) -> str:
    cause = error
    while type(cause).__module__.startswith("datasets."):
        deeper = cause.__cause__ or cause.__context__
        if deeper is None:
            break
        cause = deeper
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__


def _field_missing(source: DatasetSource, columns) -> DataError:
    return missing_field_error(source.text_field, f"dataset {source.name}", columns)


def document_text(row_text: Any, source: DatasetSource) -> str | None:
    if row_text is None or isinstance(row_text, str):
        return row_text
    raise DataError(
        f"field {source.text_field!r} of dataset {source.name} holds "
        f"{type(row_text).__name__}, not text"
    )


class IndexedDocuments:
    """Documents of a map-style dataset; a cursor is a row index."""

    def __init__(self, dataset, source: DatasetSource):
        if source.text_field not in dataset.column_names:
            raise _field_missing(source, dataset.column_names)
        if len(dataset) == 0:
            raise DataError(f"dataset {source.name} is empty")
        self.dataset = dataset
        self.source = source
        rows = slice(*(source.rows or (None, None)))
        self.start_cursor, self.stop, _ = rows.indices(len(dataset))
        if self.stop <= self.start_cursor:
            raise DataError(f"dataset {source.name} has no rows in {source.rows}")

    def read(self, cursor: int) -> Iterator[tuple[int, str | None]]:
        """Yield (cursor, text) for each document from ``cursor`` on."""
        for block_start in range(cursor, self.stop, ROWS_PER_READ):
            block = self.dataset[block_start : min(block_start + ROWS_PER_READ, self.stop)]
            for offset, text in enumerate(block[self.source.text_field]):
                yield block_start + offset, document_text(text, self.source)


class StreamingDocuments:
    """Documents of a Hugging Face IterableDataset; a cursor is its state_dict before a document."""

    def __init__(self, dataset, source: DatasetSource):
        self.dataset = dataset
        self.source = source
        self.start_cursor = dataset.state_dict()

    def read(self, cursor: dict) -> Iterator[tuple[dict, str | None]]:
        """Yield (cursor, text) for each document from ``cursor`` on."""
        self.dataset.load_state_dict(cursor)
        for row in self.dataset:
            if self.source.text_field not in row:
                raise _field_missing(self.source, list(row))
            yield cursor, document_text(row[self.source.text_field], self.source)
            # Taken once the consumer is done with the row: the position just after it.
            cursor = self.dataset.state_dict()


def open_documents(source: DatasetSource) -> IndexedDocuments | StreamingDocuments:
    dataset = load_hf_dataset(source)
    if source.streaming:
        return StreamingDocuments(dataset, source)
    return IndexedDocuments(dataset, source)


@dataclass
class StreamPosition:
    """Global position in the token stream: the same on every data-parallel rank."""

    epoch: int
    cursor: Any
    offset: int  # tokens of the cursor's document (with BOS/EOS) already consumed
    windows: int  # global windows emitted so far, summed over ranks
    document: int = 0  # the cursor's document's index in its epoch


class TextDataset(IterableDataset, Stateful):
    """Packs the documents of a source into ``(input_ids, labels)`` windows; see module doc."""

    def __init__(
        self,
        source: str | DatasetSource,
        tokenizer: Tokenizer,
        seq_len: int,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        infinite: bool = True,
        join_documents: int = 1,
    ):
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        if join_documents < 1:
            raise ValueError(f"join_documents must be positive, got {join_documents}")
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank {dp_rank} not in [0, dp_world_size={dp_world_size})")
        self.source = resolve_source(source) if isinstance(source, str) else source
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.infinite = infinite
        self.join_documents = join_documents
        self.documents = open_documents(self.source)
        self.position = StreamPosition(0, self.documents.start_cursor, 0, 0)

    def _documents_from(self, position: StreamPosition) -> Iterator[tuple[Any, ...]]:
        """Yield (epoch, cursor, index, tokens, joined) per document, looping over epochs when
        infinite; ``joined``: the document continues the previous one (``join_documents``)."""
        epoch, cursor, index = position.epoch, position.cursor, position.document
        while True:
            from_start = cursor == self.documents.start_cursor
            empty = True
            for doc_cursor, text in self.documents.read(cursor):
                if text is not None:
                    empty = False
                    tokens = self.tokenizer.encode(text, bos=True, eos=True)
                    yield epoch, doc_cursor, index, tokens, index % self.join_documents > 0
                    index += 1
            if empty and from_start:
                raise DataError(f"dataset {self.source.name} has no documents")
            if not self.infinite:
                return
            epoch, cursor, index = epoch + 1, self.documents.start_cursor, 0
            logger.warning("dataset %s re-looping (epoch %d)", self.source.name, epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for inputs, labels, _, _ in self.positioned_samples():
            yield inputs, labels

    def positioned_samples(self) -> Iterator[tuple[torch.Tensor, ...]]:
        """``(inputs, labels, positions, state)`` per sample: ``positions`` holds each input
        token's position in its document (0 where a document, or the sample, starts) and
        ``state`` is ``state_dict()`` just after the sample."""
        window_len = self.seq_len + 1
        round_len = window_len * self.dp_world_size
        mine_start = self.dp_rank * window_len
        mine_end = mine_start + window_len
        skip = self.position.offset  # applies to the first document only: the one resumed in
        filled = 0  # tokens of the current round seen so far
        window: list[int] = []
        positions: list[int] = []
        for epoch, cursor, index, tokens, joined in self._documents_from(self.position):
            offset, skip = skip, 0
            while offset < len(tokens):
                take = min(round_len - filled, len(tokens) - offset)
                lo, hi = max(filled, mine_start), min(filled + take, mine_end)
                if lo < hi:
                    piece_start = offset + lo - filled
                    continues = positions and (piece_start > 0 or joined)
                    first = positions[-1] + 1 if continues else 0
                    positions.extend(range(first, first + hi - lo))
                    window.extend(tokens[piece_start : offset + hi - filled])
                filled += take
                offset += take
                if filled == round_len:
                    windows = self.position.windows + self.dp_world_size
                    self.position = StreamPosition(epoch, cursor, offset, windows, index)
                    sample = torch.tensor(window, dtype=torch.long)
                    document_positions = torch.tensor(positions[:-1], dtype=torch.int32)
                    filled, window, positions = 0, [], []
                    yield sample[:-1], sample[1:], document_positions, self.state_dict()

    def state_dict(self) -> dict[str, Any]:
        p = self.position
        return {
            "epoch": p.epoch,
            "cursor": p.cursor,
            "offset": p.offset,
            "windows": p.windows,
            "document": p.document,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # "document" is absent from states saved before documents could be joined.
        self.position = StreamPosition(
            state_dict["epoch"],
            state_dict["cursor"],
            state_dict["offset"],
            state_dict["windows"],
            state_dict.get("document", 0),
        )
