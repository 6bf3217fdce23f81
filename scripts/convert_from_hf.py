"""Import a Hugging Face Llama checkpoint (safetensors) as a torchtitan DCP checkpoint.

    python scripts/convert_from_hf.py --hf Llama-3.1-8B --out llama8b_dcp --flavor 8B
    ./run_train.sh --model.flavor 8B --checkpoint.initial_load_path llama8b_dcp ...

The output has the seed checkpoint's format (``{"model": state_dict}`` written with DCP from one
process), so ``--checkpoint.initial_load_path`` loads it into any parallel layout. ``--flavor``
checks that the HF config describes exactly that flavor's shapes and function; either way the
flavor that matches (if any) is printed. Tied embeddings (Llama 3.2 1B/3B) are untied: the output
head starts as a copy of the embedding table.

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

from _hf_cli import check_out_dir, fresh_temporary, publish, run_cli  # noqa: E402

from torchtitan.checkpoint import save_model_state  # noqa: E402
from torchtitan.dtypes import DTYPES, dtype_from_name  # noqa: E402
from torchtitan.models.llama3 import MODEL_FLAVORS, hf  # noqa: E402

AUTO_DTYPE = "auto"  # as stored in the safetensors files


def convert(
    hf_dir: Path, out: Path, flavor: str | None = None, dtype: str = "float32", strict: bool = True
) -> hf.HFCheckpoint:
    check_out_dir(out)
    if flavor is not None and flavor not in MODEL_FLAVORS:
        raise ValueError(f"unknown flavor '{flavor}'; choose one of: {', '.join(MODEL_FLAVORS)}")
    ckpt = hf.inspect_hf_checkpoint(hf_dir, strict=strict)
    if flavor is not None:
        hf.check_compatible(ckpt.args, MODEL_FLAVORS[flavor], f"flavor {flavor}")
    torch_dtype = None if dtype == AUTO_DTYPE else dtype_from_name(dtype)
    sd = {}
    for path in ckpt.files:
        sd.update(hf.read_hf_file(path, ckpt.args, ckpt.tie_word_embeddings, torch_dtype))
    hf.check_keys(sd, hf.expected_shapes(ckpt.args), f"converted {hf_dir}")

    tmp = fresh_temporary(out)
    save_model_state(sd, tmp)
    publish(tmp, out)
    return ckpt


def summary(hf_dir: Path, out: Path, ckpt: hf.HFCheckpoint) -> str:
    n = ckpt.args.num_params()
    lines = [f"imported {hf_dir} ({n:,} parameters, {len(ckpt.files)} file(s)) to {out}"]
    flavors = hf.matching_flavors(ckpt.args)
    if flavors:
        lines.append(
            f"matches flavor {flavors[0]}: train with --model.flavor {flavors[0]} "
            f"--checkpoint.initial_load_path {out}"
        )
    else:
        lines.append("matches none of the flavors (" + ", ".join(MODEL_FLAVORS) + ") exactly")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hf", required=True, type=Path, help="HF folder (config.json + safetensors)")
    p.add_argument("--out", required=True, type=Path, help="DCP checkpoint folder to create")
    p.add_argument("--flavor", help="fail unless the HF config matches this flavor exactly")
    p.add_argument("--dtype", default="float32", choices=[*DTYPES, AUTO_DTYPE])
    p.add_argument(
        "--no-strict",
        action="store_true",
        help="ignore safetensors entries that are not Llama parameters",
    )
    a = p.parse_args(argv)

    def do_import() -> str:
        ckpt = convert(a.hf, a.out, a.flavor, a.dtype, strict=not a.no_strict)
        return summary(a.hf, a.out, ckpt)

    return run_cli(do_import)


if __name__ == "__main__":
    sys.exit(main())
