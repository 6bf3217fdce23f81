"""Dataset sources: a dataset spec (``training.dataset``) -> where its documents come from.

Specs:

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
"""

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from torchtitan.data import json_lines
from torchtitan.data.errors import DataError
from torchtitan.data.splits import HUB_PREFIX, Rows, sample_rows, split_spec
from torchtitan.paths import shown

SAMPLE_CORPUS = Path(__file__).resolve().parents[1] / "assets" / "sample_corpus.jsonl"
BUILDER_BY_EXTENSION = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
SUPPORTED_EXTENSIONS = ", ".join(BUILDER_BY_EXTENSION)


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


def column_names(path: Path, builder: str) -> list[str]:
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
    check_has_field(path, text_field, list(record))
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
    check_has_field(path, text_field, column_names(path, builder))


def check_has_field(path: Path, text_field: str, names: list[str]) -> None:
    if text_field not in names:
        raise missing_field_error(text_field, shown(path), names)


def missing_field_error(text_field: str, where: str, columns) -> DataError:
    return DataError(
        f"text field {text_field!r} not found in {where}; "
        f"available columns: {', '.join(columns) or '(none)'}"
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
