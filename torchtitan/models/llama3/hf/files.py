"""HF checkpoint folders: config.json and safetensors files, read and checked on one process.

``safetensors`` is imported only where files are read.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from torchtitan.models.llama3.args import ModelArgs
from torchtitan.models.llama3.hf.config import check_compatible, model_args_from_hf_config
from torchtitan.models.llama3.hf.mapping import (
    check_keys,
    check_shapes,
    expected_shapes,
    few_names,
    from_hf_tensor,
    hf_name,
    is_ignored_hf_key,
    our_name,
)

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"


def read_hf_config(hf_dir: str | Path) -> dict:
    path = Path(hf_dir) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"no {CONFIG_FILE} in {hf_dir}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def hf_weight_files(hf_dir: str | Path) -> list[Path]:
    """The safetensors files of an HF checkpoint: from the index if there is one."""
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise ValueError(f"HF checkpoint folder {hf_dir} does not exist")
    index = hf_dir / SAFETENSORS_INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{index} is not a safetensors index: {e!r}") from None
        files = [hf_dir / name for name in sorted(set(weight_map.values()))]
        if missing := [f.name for f in files if not f.is_file()]:
            raise ValueError(f"{index.name} lists missing file(s): {few_names(missing)}")
        return files
    if (hf_dir / SAFETENSORS_FILE).is_file():
        return [hf_dir / SAFETENSORS_FILE]
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        hint = " (convert .bin weights to safetensors first)" if any(hf_dir.glob("*.bin")) else ""
        raise ValueError(f"no *.safetensors files in {hf_dir}{hint}")
    return files


def open_safetensors(path: Path):
    """``safe_open`` of one file (pt), with one-line ValueErrors."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise ValueError(
            "reading HF checkpoints needs the safetensors package: pip install -e '.[hf]'"
        ) from None
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # safetensors raises its own error types
        raise ValueError(f"cannot read {path}: {e}") from None


def hf_tensor_shapes(files: list[Path]) -> dict[str, tuple[tuple[int, ...], Path]]:
    """HF name -> (shape, file), from the safetensors headers only (no tensor data is read)."""
    out = {}
    for path in files:
        with open_safetensors(path) as f:
            for key in f.keys():
                if key in out:
                    raise ValueError(f"{key} appears in both {out[key][1].name} and {path.name}")
                out[key] = (tuple(f.get_slice(key).get_shape()), path)
    return out


@dataclasses.dataclass
class HFCheckpoint:
    """A validated HF checkpoint folder."""

    path: Path
    config: dict
    args: ModelArgs  # from config.json (another family's args for its folders, e.g. Qwen3Args)
    files: list[Path]
    tie_word_embeddings: bool


def inspect_hf_checkpoint(
    hf_dir: str | Path, args: ModelArgs | None = None, strict: bool = True
) -> HFCheckpoint:
    """Read config.json and the safetensors headers; one-line ValueError if they disagree with
    each other or (when given) with ``args``. No tensor data is read."""
    cfg = read_hf_config(hf_dir)
    hf_args = model_args_from_hf_config(cfg)
    if args is not None:
        check_compatible(hf_args, args)
    files = hf_weight_files(hf_dir)
    shapes = {k: v for k, v in hf_tensor_shapes(files).items() if not is_ignored_hf_key(k)}
    tie = bool(cfg.get("tie_word_embeddings", False))
    expected = {hf_name(k) for k in expected_shapes(hf_args)}
    if tie and "lm_head.weight" not in shapes:
        expected.discard("lm_head.weight")
    check_keys(shapes, expected, f"HF checkpoint {hf_dir}", strict=strict)
    ours = {our_name(k): shape for k, (shape, _) in shapes.items() if k in expected}
    check_shapes(ours, hf_args, f"HF checkpoint {hf_dir} vs its config.json")
    return HFCheckpoint(Path(hf_dir), cfg, hf_args, files, tie)


def read_hf_file(
    path: Path, args: ModelArgs, tie_word_embeddings: bool, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """One safetensors file, converted to our names and layout (and ``dtype`` if given).

    Keys that are not Llama parameters are skipped (``inspect_hf_checkpoint`` decides whether
    they are an error).
    """
    expected = expected_shapes(args)
    sd = {}
    with open_safetensors(path) as f:
        for key in f.keys():
            if is_ignored_hf_key(key):
                continue
            try:
                name = our_name(key)
            except ValueError:
                continue
            if name not in expected:
                continue
            t = f.get_tensor(key)
            name, t = from_hf_tensor(key, t if dtype is None else t.to(dtype), args)
            sd[name] = t
    if tie_word_embeddings and "tok_embeddings.weight" in sd:
        sd.setdefault("output.weight", sd["tok_embeddings.weight"].clone())
    return sd


def read_hf_files(
    ckpt: HFCheckpoint, args: ModelArgs, dtype: torch.dtype | None = None
) -> Iterator[dict[str, torch.Tensor]]:
    """``read_hf_file`` of each of the checkpoint's files in turn: one state dict per file."""
    for path in ckpt.files:
        yield read_hf_file(path, args, ckpt.tie_word_embeddings, dtype)
