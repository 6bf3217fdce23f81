"""Text datasets: documents from a source, packed into fixed-length token windows.

Dataset specs (``training.dataset``):

- ``sample``: the bundled ``torchtitan/assets/sample_corpus.jsonl`` (Python documentation)
  without its held-out documents, which ``sample@validation`` reads (``splits.py``).
- ``c4``: Hugging Face hub ``allenai/c4``, config ``en``, split ``train``, streamed.
- ``hf:ORG/NAME`` or ``hf:ORG/NAME:CONFIG``: any hub dataset, split ``train``, streamed; e.g.
  ``hf:HuggingFaceFW/fineweb-edu:sample-10BT``. Hub ids need the ``hf:`` prefix so that a
  mistyped local path never silently turns into a download. ``@SPLIT`` after ``c4`` or a hub id
  reads another split (``c4@validation``).
- a local file or folder: ``.jsonl``/``.json`` (JSON builder), ``.parquet``, or ``.txt`` (one
  document per blank-line separated paragraph). A folder uses all files of those extensions
  below it (sorted, hidden ones skipped), which must all need the same builder. Local data is
  loaded map-style (Hugging Face converts it to its Arrow cache once). The keywords above win over
  a local path of the same name; write ``./sample`` to mean a folder.

Each record's ``text_field`` (default ``text``) is one document.

Packing: every document becomes ``[BOS] + tokens + [EOS]``; documents are concatenated, across
epochs too, into one global token stream, which is cut into non-overlapping windows of
``seq_len + 1`` tokens (stride ``seq_len + 1``). A window ``w`` gives the sample
``(w[:-1], w[1:])``, so the last label of a window is never an input; that costs one token in
``seq_len + 1`` and keeps windows independent.

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
the document's tokens already consumed, and the number of global windows emitted. Resuming
re-tokenizes only the current document.

When the source is exhausted it is read again from the start (logged as re-looping, epoch counter
in the state); with ``infinite=False`` iteration stops instead, dropping the trailing tokens that
don't fill a whole round so that all ranks stop after the same number of samples.
"""

import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset

from torchtitan.data import json_lines
from torchtitan.data.errors import DataError
from torchtitan.data.splits import HUB_PREFIX, Rows, sample_rows, split_spec
from torchtitan.data.tokenizer import Tokenizer
from torchtitan.paths import absolute, shown

logger = logging.getLogger(__name__)

SAMPLE_CORPUS = Path(__file__).resolve().parents[1] / "assets" / "sample_corpus.jsonl"
BUILDER_BY_EXTENSION = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
SUPPORTED_EXTENSIONS = ", ".join(BUILDER_BY_EXTENSION)
ROWS_PER_READ = 256


@dataclass(frozen=True)
class DatasetSource:
    """Where documents come from: local files (builder + data_files) or a hub dataset."""

    name: str
    text_field: str = "text"
    builder: str | None = None
    data_files: tuple[str, ...] = ()
    hub_id: str | None = None
    hub_config: str | None = None
    split: str = "train"
    streaming: bool = False
    rows: Rows | None = None  # local data: only this slice of the rows (the sample's splits)


def builder_for(path: Path) -> str:
    builder = BUILDER_BY_EXTENSION.get(path.suffix.lower())
    if builder is None:
        raise DataError(
            f"unsupported dataset file extension {path.suffix!r} for {shown(path)}; "
            f"expected one of {SUPPORTED_EXTENSIONS}"
        )
    return builder


def column_names(path: Path, builder: str) -> list[str] | None:
    if builder == "text":
        return ["text"]
    import pyarrow.parquet

    return pyarrow.parquet.read_schema(path).names


def check_first_json_record(path: Path, text_field: str) -> None:
    """The first record parses and holds text in ``text_field``; the error names file and line."""
    try:
        found = json_lines.first_record(path)
    except json_lines.RecordProblem as e:
        raise DataError(f"dataset file {shown(path)}, line {e.line_number}: {e.problem}") from None
    if found is None:
        return
    line_number, record = found
    if text_field not in record:
        raise DataError(
            f"text field {text_field!r} not found in {shown(path)}; "
            f"available columns: {', '.join(record) or '(none)'}"
        )
    value = record[text_field]
    if value is not None and not isinstance(value, str):
        raise DataError(
            f"dataset file {shown(path)}, line {line_number}: field {text_field!r} holds "
            f"a JSON {json_lines.kind_of(value)}, not text"
        )


def check_text_field(path: Path, builder: str, text_field: str) -> None:
    if builder == "json":
        check_first_json_record(path, text_field)
        return
    names = column_names(path, builder)
    if names is not None and text_field not in names:
        raise DataError(
            f"text field {text_field!r} not found in {shown(path)}; "
            f"available columns: {', '.join(names) or '(none)'}"
        )


def check_not_empty(path: Path) -> None:
    if path.stat().st_size == 0:
        raise DataError(f"dataset file is empty: {shown(path)}")


def is_hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def folder_files(folder: Path) -> list[Path]:
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and p.suffix.lower() in BUILDER_BY_EXTENSION and not is_hidden(p, folder)
    )
    if not files:
        raise DataError(f"dataset folder has no {SUPPORTED_EXTENSIONS} files: {shown(folder)}")
    return files


def local_source(path: Path, name: str, text_field: str) -> DatasetSource:
    files = folder_files(path) if path.is_dir() else [path]
    builders = sorted({builder_for(f) for f in files})
    if len(builders) > 1:
        raise DataError(
            f"dataset folder {shown(path)} mixes file kinds ({', '.join(builders)}); keep one kind"
        )
    for f in files:
        check_not_empty(f)
    check_text_field(files[0], builders[0], text_field)
    data_files = tuple(str(f) for f in files)
    return DatasetSource(name, text_field, builder=builders[0], data_files=data_files)


def hub_source(spec: str, text_field: str, split: str | None) -> DatasetSource:
    hub_id, _, config = spec.removeprefix(HUB_PREFIX).partition(":")
    if not hub_id or " " in hub_id or ":" in config:
        raise DataError(f"bad hub dataset spec {spec!r}; expected hf:ORG/NAME[:CONFIG][@SPLIT]")
    name = spec if split is None else f"{spec}@{split}"
    return DatasetSource(
        name,
        text_field,
        hub_id=hub_id,
        hub_config=config or None,
        split=split or "train",
        streaming=True,
    )


def looks_like_path(spec: str) -> bool:
    return "/" in spec or "." in spec or spec.startswith("~")


def missing_path_error(spec: str) -> DataError:
    hint = ""
    names_a_file = Path(spec).suffix.lower() in BUILDER_BY_EXTENSION
    if "/" in spec and not spec.startswith(("/", ".", "~")) and not names_a_file:
        hint = f" (for a Hugging Face hub dataset write {HUB_PREFIX}{spec})"
    return DataError(f"dataset path not found: {shown(spec)}{hint}")


def resolve_source(spec: str, text_field: str = "text") -> DatasetSource:
    """Turn a dataset spec into a DatasetSource, cheaply checking what can be checked locally."""
    base, split = split_spec(spec)
    if base == "sample":
        source = local_source(SAMPLE_CORPUS, spec, text_field)
        return dataclasses.replace(source, rows=sample_rows(split))  # local files: HF split "train"
    if base == "c4":
        c4 = hub_source(f"{HUB_PREFIX}allenai/c4:en", text_field, split)
        return dataclasses.replace(c4, name=spec)
    if base.startswith(HUB_PREFIX):
        return hub_source(base, text_field, split)
    path = Path(spec).expanduser()
    if spec and path.exists():
        return local_source(path, spec, text_field)
    if looks_like_path(spec):
        raise missing_path_error(spec)
    raise DataError(
        f"unknown dataset {spec!r}; expected 'sample', 'c4', '{HUB_PREFIX}ORG/NAME[:CONFIG]' "
        f"or an existing file or folder of {SUPPORTED_EXTENSIONS}"
    )


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
        raise DataError(
            f"could not load dataset {source.name}: {load_failure(source, error)}"
        ) from (error)


def load_failure(source: DatasetSource, error: BaseException) -> str:
    """The line of a JSON file that is not a record, else the first cause in ``error``'s chain
    that the datasets library did not raise (its own say "An error occurred while generating the
    dataset")."""
    if source.builder == "json":
        bad = json_lines.first_bad_line(list(source.data_files))
        if bad is not None:
            return f"{absolute(bad.path)}, line {bad.line_number}: {bad.problem}"
    cause = error
    while type(cause).__module__.startswith("datasets."):
        deeper = cause.__cause__ or cause.__context__
        if deeper is None:
            break
        cause = deeper
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__


def missing_field_error(source: DatasetSource, columns) -> DataError:
    return DataError(
        f"text field {source.text_field!r} not found in dataset {source.name}; "
        f"available columns: {', '.join(columns) or '(none)'}"
    )


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
            raise missing_field_error(source, dataset.column_names)
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
                raise missing_field_error(self.source, list(row))
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
    ):
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank {dp_rank} not in [0, dp_world_size={dp_world_size})")
        self.source = resolve_source(source) if isinstance(source, str) else source
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.infinite = infinite
        self.documents = open_documents(self.source)
        self.position = StreamPosition(0, self.documents.start_cursor, 0, 0)

    def _documents_from(self, position: StreamPosition) -> Iterator[tuple[int, Any, list[int]]]:
        """Yield (epoch, cursor, tokens) per document, looping over epochs when infinite."""
        epoch, cursor = position.epoch, position.cursor
        while True:
            from_start = cursor == self.documents.start_cursor
            empty = True
            for doc_cursor, text in self.documents.read(cursor):
                if text is not None:
                    empty = False
                    yield epoch, doc_cursor, self.tokenizer.encode(text, bos=True, eos=True)
            if empty and from_start:
                raise DataError(f"dataset {self.source.name} has no documents")
            if not self.infinite:
                return
            epoch, cursor = epoch + 1, self.documents.start_cursor
            logger.warning("dataset %s re-looping (epoch %d)", self.source.name, epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for inputs, labels, _ in self.positioned_samples():
            yield inputs, labels

    def positioned_samples(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]]:
        """Like iterating, each sample followed by the state just after it (``state_dict()``)."""
        window_len = self.seq_len + 1
        round_len = window_len * self.dp_world_size
        mine_start = self.dp_rank * window_len
        mine_end = mine_start + window_len
        skip = self.position.offset  # applies to the first document only: the one resumed in
        filled = 0  # tokens of the current round seen so far
        window: list[int] = []
        for epoch, cursor, tokens in self._documents_from(self.position):
            offset, skip = skip, 0
            while offset < len(tokens):
                take = min(round_len - filled, len(tokens) - offset)
                lo, hi = max(filled, mine_start), min(filled + take, mine_end)
                if lo < hi:
                    window.extend(tokens[offset + lo - filled : offset + hi - filled])
                filled += take
                offset += take
                if filled == round_len:
                    windows = self.position.windows + self.dp_world_size
                    self.position = StreamPosition(epoch, cursor, offset, windows)
                    sample = torch.tensor(window, dtype=torch.long)
                    filled, window = 0, []
                    yield sample[:-1], sample[1:], self.state_dict()

    def state_dict(self) -> dict[str, Any]:
        p = self.position
        return {"epoch": p.epoch, "cursor": p.cursor, "offset": p.offset, "windows": p.windows}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.position = StreamPosition(
            state_dict["epoch"], state_dict["cursor"], state_dict["offset"], state_dict["windows"]
        )
