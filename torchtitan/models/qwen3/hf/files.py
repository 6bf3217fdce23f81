"""HF Qwen3 / Qwen3-MoE checkpoint folders, read and checked on one process, file by file.

The folder format (config.json, the safetensors files and their index) is the one Llama's
folders have: ``torchtitan.models.llama3.hf.files`` finds and opens the files; this module maps
the tensors (``mapping``) and the config (``config``). The functions have the names and
signatures of Llama's, so a caller picks the family's ``hf`` package and calls the same ones.

The experts: HF files hold one matrix per expert, and ``save_pretrained`` may put a layer's
experts in different files. ``read_hf_files`` keeps the matrices of a layer's stacked tensor
until the last of them is read, then yields the stacked tensor with that file's other tensors;
so no more than one file plus the incomplete stacks is held. Each router's ``expert_bias`` (no HF
counterpart) comes with its gate, as zeros. A tied head (``tie_embeddings``) comes with the
embedding table, as the same tensor; a redundant ``lm_head.weight`` in a tied folder is ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from torchtitan.models.llama3.hf.files import (
    HFCheckpoint,
    hf_tensor_shapes,
    hf_weight_files,
    open_safetensors,
    read_hf_config,
)
from torchtitan.models.qwen3.args import Qwen3Args
from torchtitan.models.qwen3.hf.config import check_compatible, model_args_from_hf_config
from torchtitan.models.qwen3.hf.mapping import (
    EXPERT_BIAS,
    check_keys,
    check_shapes,
    expected_hf_shapes,
    hf_expert_source,
    is_ignored_hf_key,
    our_name,
)

_GATE = "moe.router.gate.weight"


def inspect_hf_checkpoint(
    hf_dir: str | Path, args: Qwen3Args | None = None, strict: bool = True
) -> HFCheckpoint:
    """Read config.json and the safetensors headers; one-line ValueError if they disagree with
    each other or (when given) with ``args``. No tensor data is read."""
    cfg = read_hf_config(hf_dir)
    hf_args = model_args_from_hf_config(cfg)
    if args is not None:
        check_compatible(hf_args, args)
    files = hf_weight_files(hf_dir)
    shapes = {k: v for k, (v, _) in hf_tensor_shapes(files).items() if not is_ignored_hf_key(k)}
    if hf_args.tie_embeddings:
        shapes.pop("lm_head.weight", None)  # a redundant copy of the embedding table
    expected = expected_hf_shapes(hf_args)
    check_keys(shapes, expected, f"HF checkpoint {hf_dir}", strict=strict)
    check_shapes(shapes, hf_args, f"HF checkpoint {hf_dir} vs its config.json", expected)
    return HFCheckpoint(Path(hf_dir), cfg, hf_args, files, hf_args.tie_embeddings)


def _target(key: str, args: Qwen3Args) -> str | tuple[str, int] | None:
    """Where an HF tensor goes: our name, (stacked expert tensor, expert), or None (not one of
    the model's: ``inspect_hf_checkpoint`` decides whether that is an error)."""
    if is_ignored_hf_key(key) or (key == "lm_head.weight" and args.tie_embeddings):
        return None
    if (expert := hf_expert_source(key, args)) is not None:
        return expert
    try:
        return our_name(key, args)
    except ValueError:
        return None


def _read_file(
    path: Path,
    args: Qwen3Args,
    dtype: torch.dtype | None,
    pending: dict[str, dict[int, torch.Tensor]],
) -> dict[str, torch.Tensor]:
    """One file's tensors in our names; expert matrices join ``pending`` until their stack is
    complete."""
    sd = {}
    with open_safetensors(path) as f:
        for key in f.keys():
            target = _target(key, args)
            if target is None:
                continue
            t = f.get_tensor(key)
            t = t if dtype is None else t.to(dtype)
            if isinstance(target, str):
                sd[target] = t
                if target.endswith(_GATE):
                    bias = target[: -len(_GATE)] + EXPERT_BIAS
                    sd[bias] = torch.zeros(args.moe.num_experts, dtype=torch.float32)
                continue
            name, expert = target
            pending.setdefault(name, {})[expert] = t
            if len(pending[name]) == args.moe.num_experts:
                mats = pending.pop(name)
                sd[name] = torch.stack([mats[e] for e in range(args.moe.num_experts)])
    if args.tie_embeddings and "tok_embeddings.weight" in sd:
        sd["output.weight"] = sd["tok_embeddings.weight"]
    return sd


def read_hf_files(
    ckpt: HFCheckpoint, args: Qwen3Args, dtype: torch.dtype | None = None
) -> Iterator[dict[str, torch.Tensor]]:
    """One state dict (our names, in ``dtype`` if given) per file of the checkpoint, in order;
    a stacked expert tensor comes with the file that completes it."""
    pending: dict[str, dict[int, torch.Tensor]] = {}
    for path in ckpt.files:
        yield _read_file(path, args, dtype, pending)
    if pending:
        raise ValueError(f"HF checkpoint {ckpt.path} lacks some experts of {sorted(pending)[0]}")
