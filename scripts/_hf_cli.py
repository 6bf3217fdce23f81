"""What the two HF conversion scripts share: the model families, the output-folder rules and the
error handling.

A family (``HF_FAMILIES``: Llama 3, Qwen3 dense and MoE, DeepSeek-V3) brings its flavors and its
``hf`` package; the packages have the same functions, so the scripts call them alike. The output is
written to ``OUT.tmp`` and renamed when complete; an existing non-empty ``OUT`` is never touched.
Errors a user can cause are printed as one ``error: ...`` line, exit status 1.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from torchtitan.models import deepseek_v3, llama3, qwen3
from torchtitan.models.deepseek_v3 import hf as deepseek_v3_hf
from torchtitan.models.llama3 import hf as llama3_hf
from torchtitan.models.qwen3 import hf as qwen3_hf


@dataclass(frozen=True)
class HFFamily:
    name: str  # --model-name, as the trainer's --model.name
    title: str  # for messages
    model_types: tuple[str, ...]  # config.json model_type values it reads
    hf: ModuleType  # torchtitan.models.<family>.hf
    flavors: Mapping[str, Any]
    get_model_args: Callable[..., Any]  # (flavor, **overrides) -> validated args


HF_FAMILIES = {
    "llama3": HFFamily(
        "llama3", "Llama 3", ("llama",), llama3_hf, llama3.MODEL_FLAVORS, llama3.get_model_args
    ),
    "qwen3": HFFamily(
        "qwen3",
        "Qwen3",
        ("qwen3", "qwen3_moe"),
        qwen3_hf,
        qwen3.MODEL_FLAVORS,
        qwen3.get_model_args,
    ),
    "deepseek_v3": HFFamily(
        "deepseek_v3",
        "DeepSeek-V3",
        ("deepseek_v3",),
        deepseek_v3_hf,
        deepseek_v3.MODEL_FLAVORS,
        deepseek_v3.get_model_args,
    ),
}


def family_of_hf_config(cfg: dict) -> HFFamily:
    """The family of an HF config.json, from its ``model_type`` (none: Llama, as before)."""
    model_type = cfg.get("model_type", "llama")
    for family in HF_FAMILIES.values():
        if model_type in family.model_types:
            return family
    known = "; ".join(f"{', '.join(f.model_types)} ({f.title})" for f in HF_FAMILIES.values())
    raise ValueError(f"HF config model_type is '{model_type}'; this script reads {known}")


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
