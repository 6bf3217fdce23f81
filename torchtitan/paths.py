"""How errors name a path the user gave: the absolute path that was looked at, and what they wrote.

A relative path means a path relative to the directory the command was run from (``run_train.sh``
does not change directory). An error that only repeated ``data/x.jsonl`` would leave the user to
guess which ``data/`` was meant, so it says ``/home/u/data/x.jsonl (from 'data/x.jsonl')``.
"""

from __future__ import annotations

import os
from pathlib import Path


def absolute(path: str | os.PathLike) -> Path:
    """``path`` with ``~`` expanded, made absolute against the current directory."""
    return Path(path).expanduser().absolute()


def shown(path: str | os.PathLike) -> str:
    """``/abs/path``, followed by ``(from 'what the user wrote')`` when that was not the same."""
    full = absolute(path)
    written = os.fspath(path)
    return str(full) if written == str(full) else f"{full} (from {written!r})"
