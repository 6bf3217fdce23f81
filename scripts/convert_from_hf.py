"""Import a Hugging Face Llama 3 or Qwen3 (dense or MoE) checkpoint (safetensors) as a torchtitan
DCP checkpoint.

    python scripts/convert_from_hf.py --hf Llama-3.1-8B --out llama8b_dcp --flavor 8B
    ./run_train.sh --model.flavor 8B --checkpoint.initial_load_path llama8b_dcp ...
    python scripts/convert_from_hf.py --hf Qwen3-30B-A3B --out qwen_dcp --flavor 30B-A3B
    ./run_train.sh --model.name qwen3 --model.flavor 30B-A3B --checkpoint.initial_load_path qwen_dcp

The family comes from config.json's ``model_type``: ``llama`` (Llama 3), ``qwen3`` or
``qwen3_moe`` (Qwen3). The output has the seed checkpoint's format (``{"model": state_dict}``
written with DCP from one process), so ``--checkpoint.initial_load_path`` loads it into any
parallel layout. ``--flavor`` (one of the family's) checks that the HF config describes exactly
that flavor's shapes and function; either way the flavor that matches (if any) is printed.
Llama: tied embeddings (Llama 3.2 1B/3B) are untied, the output head starts as a copy of the
embedding table. Qwen3: tied embeddings stay tied (one table under both names, as our tied
flavors save it); each MoE router's ``expert_bias``, which HF checkpoints lack, starts at zero.

Weights are stored in ``--dtype`` (default float32, like the seed checkpoint: the trainer keeps
fp32 master weights; bf16 -> fp32 is exact). The whole model is held in memory once. The output
is written to ``OUT.tmp`` and renamed; an existing non-empty ``OUT`` is never touched.
See docs/hf_interop.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path[:0] = [str(SCRIPTS.parent), str(SCRIPTS)]

from _hf_cli import (  # noqa: E402
    HFFamily,
    check_out_dir,
    family_of_hf_config,
    fresh_temporary,
    publish,
    run_cli,
)

from torchtitan.checkpoint import save_model_state  # noqa: E402
from torchtitan.dtypes import DTYPES, dtype_from_name  # noqa: E402
from torchtitan.models.llama3.hf import HFCheckpoint, read_hf_config  # noqa: E402

AUTO_DTYPE = "auto"  # as stored in the safetensors files


def check_flavor(family: HFFamily, flavor: str, hf_dir: Path) -> None:
    if flavor not in family.flavors:
        raise ValueError(
            f"unknown {family.title} flavor '{flavor}' ({hf_dir} is a {family.title} folder); "
            f"choose one of: {', '.join(family.flavors)}"
        )


def convert(
    hf_dir: Path, out: Path, flavor: str | None = None, dtype: str = "float32", strict: bool = True
) -> tuple[HFFamily, HFCheckpoint]:
    check_out_dir(out)
    family = family_of_hf_config(read_hf_config(hf_dir))
    hf = family.hf
    if flavor is not None:
        check_flavor(family, flavor, hf_dir)
    ckpt = hf.inspect_hf_checkpoint(hf_dir, strict=strict)
    if flavor is not None:
        hf.check_compatible(ckpt.args, family.flavors[flavor], f"flavor {flavor}")
    torch_dtype = None if dtype == AUTO_DTYPE else dtype_from_name(dtype)
    sd = {}
    for part in hf.read_hf_files(ckpt, ckpt.args, torch_dtype):
        sd.update(part)
    hf.check_keys(sd, hf.expected_shapes(ckpt.args), f"converted {hf_dir}")

    tmp = fresh_temporary(out)
    save_model_state(sd, tmp)
    publish(tmp, out)
    return family, ckpt


def summary(hf_dir: Path, out: Path, family: HFFamily, ckpt: HFCheckpoint) -> str:
    n = ckpt.args.num_params()
    lines = [
        f"imported {hf_dir} ({family.title}, {n:,} parameters, {len(ckpt.files)} file(s)) to {out}"
    ]
    flavors = family.hf.matching_flavors(ckpt.args)
    name = "" if family.name == "llama3" else f"--model.name {family.name} "
    if flavors:
        lines.append(
            f"matches flavor {flavors[0]}: train with {name}--model.flavor {flavors[0]} "
            f"--checkpoint.initial_load_path {out}"
        )
    else:
        lines.append("matches none of the flavors (" + ", ".join(family.flavors) + ") exactly")
    if getattr(ckpt.args, "moe", None) is not None:
        lines.append("note: the MoE routers' expert_bias (not in HF checkpoints) starts at zero")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hf", required=True, type=Path, help="HF folder (config.json + safetensors)")
    p.add_argument("--out", required=True, type=Path, help="DCP checkpoint folder to create")
    p.add_argument(
        "--flavor",
        help="fail unless the HF config matches this flavor (of the folder's family) exactly",
    )
    p.add_argument("--dtype", default="float32", choices=[*DTYPES, AUTO_DTYPE])
    p.add_argument(
        "--no-strict",
        action="store_true",
        help="ignore safetensors entries that are not the model's parameters",
    )
    a = p.parse_args(argv)

    def do_import() -> str:
        family, ckpt = convert(a.hf, a.out, a.flavor, a.dtype, strict=not a.no_strict)
        return summary(a.hf, a.out, family, ckpt)

    return run_cli(do_import)


if __name__ == "__main__":
    sys.exit(main())
