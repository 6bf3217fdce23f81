"""HF DeepSeek-V3 checkpoint folders, read and checked on one process, file by file.

The folder format is Llama's (``torchtitan.models.llama3.hf.files``). Two things are DeepSeek's:

* Float8 weights: the published checkpoints store most linears as float8 (e4m3) with a
  ``{name}_scale_inv`` tensor holding one float32 scale per 128 x 128 block of the weight
  (its ``quantization_config.weight_block_size``); a weight is read as ``w * scale`` per block,
  in float32 (then ``dtype`` if given). The scale may sit in another file than its weight.
* The multi-token-prediction layers after the last block (``model.layers.{n_layers}...``) are
  skipped: this model has no MTP head.

A layer's experts are stacked once the last of them is read (as for Qwen3-MoE), so no more than
one file plus the incomplete stacks is held.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from torchtitan.models.deepseek_v3.args import DeepSeekV3Args
from torchtitan.models.deepseek_v3.hf.config import check_compatible, model_args_from_hf_config
from torchtitan.models.deepseek_v3.hf.mapping import (
    check_keys,
    check_shapes,
    expected_hf_shapes,
    hf_expert_source,
    is_ignored_hf_key,
    our_name,
)
from torchtitan.models.llama3.hf.files import (
    HFCheckpoint,
    hf_tensor_shapes,
    hf_weight_files,
    open_safetensors,
    read_hf_config,
)

SCALE_SUFFIX = "_scale_inv"
DEFAULT_BLOCK = (128, 128)


def block_size(cfg: dict) -> tuple[int, int]:
    """The float8 weights' scale block (rows, columns) of a config."""
    quant = cfg.get("quantization_config") or {}
    return tuple(quant.get("weight_block_size") or DEFAULT_BLOCK)


def dequantize(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """A block-scaled float8 weight in float32: each (block) tile times its scale."""
    rows, cols = weight.shape
    scale = scale_inv.float().repeat_interleave(block[0], 0)[:rows]
    return weight.float() * scale.repeat_interleave(block[1], 1)[:, :cols]


def inspect_hf_checkpoint(
    hf_dir: str | Path, args: DeepSeekV3Args | None = None, strict: bool = True
) -> HFCheckpoint:
    """Read config.json and the safetensors headers; one-line ValueError if they disagree with
    each other or (when given) with ``args``. No tensor data is read."""
    cfg = read_hf_config(hf_dir)
    hf_args = model_args_from_hf_config(cfg)
    if args is not None:
        check_compatible(hf_args, args)
    files = hf_weight_files(hf_dir)
    shapes = {k: v for k, (v, _) in hf_tensor_shapes(files).items()}
    if orphans := [
        k for k in shapes if k.endswith(SCALE_SUFFIX) and k[: -len(SCALE_SUFFIX)] not in shapes
    ]:
        raise ValueError(f"HF checkpoint {hf_dir} has scales without weights: {orphans[0]}")
    shapes = {
        k: v
        for k, v in shapes.items()
        if not k.endswith(SCALE_SUFFIX) and not is_ignored_hf_key(k, hf_args)
    }
    expected = expected_hf_shapes(hf_args)
    check_keys(shapes, expected, f"HF checkpoint {hf_dir}", strict=strict)
    check_shapes(shapes, hf_args, f"HF checkpoint {hf_dir} vs its config.json", expected)
    return HFCheckpoint(Path(hf_dir), cfg, hf_args, files, False)


def _target(key: str, args: DeepSeekV3Args) -> str | tuple[str, int] | None:
    """Where an HF tensor goes: our name, (stacked expert tensor, expert), or None."""
    if key.endswith(SCALE_SUFFIX) or is_ignored_hf_key(key, args):
        return None
    if (expert := hf_expert_source(key, args)) is not None:
        return expert
    try:
        return our_name(key, args)
    except ValueError:
        return None


class _Reader:
    """Reads tensors in our names, dequantizing float8 weights with their (possibly remote)
    scales, and stacks each layer's experts when complete."""

    def __init__(self, ckpt: HFCheckpoint, args: DeepSeekV3Args, dtype: torch.dtype | None):
        self.args, self.dtype, self.block = args, dtype, block_size(ckpt.config)
        shapes = hf_tensor_shapes(ckpt.files)
        self.scale_files = {k: path for k, (_, path) in shapes.items() if k.endswith(SCALE_SUFFIX)}
        self.pending: dict[str, dict[int, torch.Tensor]] = {}

    def tensor(self, f, key: str) -> torch.Tensor:
        t = f.get_tensor(key)
        scale_key = key + SCALE_SUFFIX
        if scale_key in self.scale_files:
            with open_safetensors(self.scale_files[scale_key]) as scales:
                t = dequantize(t, scales.get_tensor(scale_key), self.block)
        return t if self.dtype is None else t.to(self.dtype)

    def read_file(self, path: Path) -> dict[str, torch.Tensor]:
        sd, num_experts = {}, self.args.moe.num_experts
        with open_safetensors(path) as f:
            for key in f.keys():
                target = _target(key, self.args)
                if target is None:
                    continue
                if isinstance(target, str):
                    sd[target] = self.tensor(f, key)
                    continue
                name, expert = target
                self.pending.setdefault(name, {})[expert] = self.tensor(f, key)
                if len(self.pending[name]) == num_experts:
                    mats = self.pending.pop(name)
                    sd[name] = torch.stack([mats[e] for e in range(num_experts)])
        return sd


def read_hf_files(
    ckpt: HFCheckpoint, args: DeepSeekV3Args, dtype: torch.dtype | None = None
) -> Iterator[dict[str, torch.Tensor]]:
    """One state dict (our names, float8 weights dequantized, in ``dtype`` if given) per file
    of the checkpoint, in order; a stacked expert tensor comes with the file that completes it."""
    reader = _Reader(ckpt, args, dtype)
    for path in ckpt.files:
        yield reader.read_file(path)
    if reader.pending:
        raise ValueError(
            f"HF checkpoint {ckpt.path} lacks some experts of {sorted(reader.pending)[0]}"
        )
