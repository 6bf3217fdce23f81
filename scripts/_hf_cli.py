"""What the two HF conversion scripts share: the output-folder rules and the error handling.

The output is written to ``OUT.tmp`` and renamed when complete; an existing non-empty ``OUT`` is
never touched. Errors a user can cause are printed as one ``error: ...`` line, exit status 1.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path


def check_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"output folder {out} already exists and is not empty; choose another")


def fresh_temporary(out: Path) -> Path:
    """``OUT.tmp``, emptied of what an interrupted earlier run left there (not created)."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def publish(tmp: Path, out: Path) -> None:
    """Rename the finished temporary folder to ``out`` (an empty ``out`` is replaced)."""
    check_out_dir(out)
    if out.exists():
        out.rmdir()
    tmp.rename(out)


def run_cli(convert: Callable[[], str]) -> int:
    """Run ``convert`` and print the summary it returns: 0; or print its error in one line: 1."""
    try:
        summary = convert()
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"error: {e}; install the hf extra: pip install -e '.[hf]'", file=sys.stderr)
        return 1
    print(summary)
    return 0
