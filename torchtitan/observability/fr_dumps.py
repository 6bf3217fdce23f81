"""Flight Recorder dumps as the hang report reads them: one ``Call`` per collective (group,
sequence number, op, shapes and dtypes, the user's frame), loaded from every rank's dump file."""

from __future__ import annotations

import ast
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2": "float8_e5m2",
}


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Call:
    """One collective as one rank recorded it."""

    rank: int
    pg: str  # Group.key
    seq: int
    op: str
    shapes: str
    state: str = "scheduled"
    done: bool | None = None
    created_ns: int = 0
    where: str = ""
    order: int = 0  # record_id: the rank's issue order over all its groups

    @property
    def signature(self) -> tuple[str, str]:
        return (self.op, self.shapes)

    def describe(self) -> str:
        return f"{self.op} {self.shapes}" if self.shapes else self.op


@dataclass
class Group:
    """A process group. Sibling groups made by ``split_group`` (e.g. the TP groups of a mesh)
    can share a name, so a group is identified by its name and its ranks (``key``)."""

    name: str
    desc: str = ""
    ranks: list[int] = field(default_factory=list)
    key: str = ""

    def label(self) -> str:
        return f"pg '{self.desc or self.name}' {self.ranks}"


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _shapes(sizes, dtypes) -> str:
    parts = []
    for i, shape in enumerate(sizes or []):
        dtype = dtypes[i] if dtypes and i < len(dtypes) else ""
        name = _DTYPES.get(dtype, dtype.lower())
        parts.append(f"{name}[{', '.join(str(d) for d in shape)}]")
    if len(parts) > 3:
        parts = parts[:3] + [f"{len(parts) - 3} more"]
    return " + ".join(parts)


def _user_frame(frames) -> str:
    """The innermost stack frame outside torch, as ``file.py:42 (function)``."""
    for f in frames or []:
        filename = str(f.get("filename", ""))
        if "/torch/" in filename or filename.startswith("<"):
            continue
        return f"{Path(filename).name}:{f.get('line')} ({f.get('name')})"
    return ""


def _key(name: str, ranks: list[int] | None) -> str:
    return f"{name}{ranks}" if ranks else name


def _call(rank: int, entry: dict, key: str) -> Call:
    done = entry.get("retired")
    if entry.get("state") == "completed":
        done = True
    return Call(
        rank=rank,
        pg=key,
        seq=int(entry.get("collective_seq_id", 0)),
        op=str(entry.get("profiling_name", "?")).split(":")[-1],
        shapes=_shapes(entry.get("input_sizes"), entry.get("input_dtypes")),
        state=str(entry.get("state", "")),
        done=done,
        created_ns=int(entry.get("time_created_ns") or 0),
        where=_user_frame(entry.get("frames")),
        order=int(entry.get("record_id") or 0),
    )


def _parse_ranks(text) -> list[int]:
    if isinstance(text, (list, tuple)):
        return [int(r) for r in text]
    try:
        value = ast.literal_eval(str(text))
        if isinstance(value, str):  # some torch versions encode the list twice
            value = ast.literal_eval(value)
        return [int(r) for r in value]
    except (ValueError, SyntaxError, TypeError):
        return []


# --------------------------------------------------------------------------- loading


def load_dumps(folder: str | Path, prefix: str = "rank_") -> dict[int, dict]:
    """``{rank: dump dict}`` of every ``<prefix><rank>`` pickle in ``folder``."""
    found = {}
    pattern = re.compile(re.escape(prefix) + r"(\d+)$")
    for path in sorted(Path(folder).iterdir()):
        m = pattern.search(path.name)
        if not m or not path.is_file():
            continue
        with open(path, "rb") as f:
            found[int(m.group(1))] = pickle.load(f)
    return found
