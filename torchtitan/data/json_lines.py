"""What is wrong with a JSON-lines file, by file and line, for errors a user can act on.

Hugging Face's JSON builder reports a bad record as "DatasetGenerationError: An error occurred
while generating the dataset", its cause as "JSON parse error: ... in row 1" of some block. These
helpers find the line instead: ``first_record`` cheaply for preflight (the first record only),
``first_bad_line`` when loading failed (reads up to the first bad line).

A ``.json`` file may also be one JSON document over many lines (an array of records, or an object),
which the builder reads too: such a file is not checked line by line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIRST_LINE_MAX_BYTES = 1 << 20


class RecordProblem(ValueError):
    """A line that is not a JSON object; ``str()`` says where and what."""

    def __init__(self, path: Path, line_number: int, problem: str):
        super().__init__(f"{path}, line {line_number}: {problem}")
        self.path, self.line_number, self.problem = path, line_number, problem


def problem_with(line: bytes) -> str | None:
    """What keeps ``line`` from being one record (a JSON object), or None."""
    return parse_record(line)[1]


def parse_record(line: bytes) -> tuple[dict | None, str | None]:
    """(the record on ``line``, None), or (None, what keeps it from being a JSON object)."""
    try:
        record = json.loads(line.rstrip())  # a column past the end would read "line 2"
    except json.JSONDecodeError as e:
        return None, f"not valid JSON: {e.msg} (column {e.colno})"
    except ValueError as e:  # not UTF-8 (or UTF-16/32)
        return None, f"not valid JSON: {e}"
    if not isinstance(record, dict):
        return None, f'a JSON {kind_of(record)}, not an object like {{"text": "..."}}'
    return record, None


def kind_of(value: Any) -> str:
    """The JSON name of the type of ``value``: "array", "number", ..."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number"}
    names[float] = "number"
    return names.get(type(value), "null")


def may_be_one_document(path: Path, line: bytes) -> bool:
    """A ``.json`` file whose first line opens an array or object: maybe one multi-line document."""
    return path.suffix.lower() == ".json" and line.lstrip()[:1] in (b"[", b"{")


def first_record(path: Path) -> tuple[int, dict] | None:
    """``(line number, record)`` of the first non-blank line; ``RecordProblem`` if it is not a
    record. None when there is nothing to check cheaply: no record, a first line over 1 MB, or a
    ``.json`` file that may be one document."""
    with path.open("rb") as f:
        number = 0
        for line in iter(lambda: f.readline(FIRST_LINE_MAX_BYTES), b""):
            number += 1
            if len(line) == FIRST_LINE_MAX_BYTES and not line.endswith(b"\n"):
                return None  # a long document; HF reads it, we do not need to
            if not line.strip():
                continue
            record, problem = parse_record(line)
            if problem is None:
                return number, record
            if may_be_one_document(path, line):
                return None
            raise RecordProblem(path, number, problem)
    return None


def first_bad_line(files: list[str | Path]) -> RecordProblem | None:
    """The first line of ``files`` (in order) that is not a record, or None if all are."""
    for name in files:
        path = Path(name)
        with path.open("rb") as f:
            first = True
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                problem = problem_with(line)
                if problem is not None:
                    if first and may_be_one_document(path, line):
                        break
                    return RecordProblem(path, number, problem)
                first = False
    return None
