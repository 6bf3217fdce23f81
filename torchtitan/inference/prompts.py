"""Reading ``--prompts_file``: a text file of one prompt per line, or JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

from torchtitan.config import ConfigError


def read_prompts(path: str) -> list[str]:
    """The prompts of ``path``: in a ``.jsonl`` file, the ``"prompt"`` string of each line's
    object (so a prompt may hold line breaks); otherwise each line without its line break.
    Blank lines are skipped. Every mistake is one ConfigError naming the file and line."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"--prompts_file {path}: no such file")
    try:
        # "\n" only: str.splitlines also breaks at form feeds, U+2028 and others, which a
        # prompt (or a JSON string written with ensure_ascii=False) may hold
        lines = [line.removesuffix("\r") for line in file.read_text(encoding="utf-8").split("\n")]
    except UnicodeDecodeError as e:
        raise ConfigError(f"--prompts_file {path} is not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise ConfigError(f"--prompts_file {path}: cannot read it ({e.strerror})") from None
    jsonl = file.suffix == ".jsonl"
    prompts = [
        _json_prompt(line, path, number) if jsonl else line
        for number, line in enumerate(lines, start=1)
        if line.strip()
    ]
    if not prompts:
        raise ConfigError(f"--prompts_file {path} holds no prompts (every line is blank)")
    return prompts


def _json_prompt(line: str, path: str, number: int) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--prompts_file {path} line {number}: not JSON ({e.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
        raise ConfigError(
            f'--prompts_file {path} line {number}: expected an object with a "prompt" string'
        )
    return record["prompt"]
