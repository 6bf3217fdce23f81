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
import shutil
import sys
import warnings
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from torchtitan.models.llama3 import MODEL_FLAVORS, hf  # noqa: E402

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "auto": None,  # as stored in the safetensors files
}


def check_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"output folder {out} already exists and is not empty; choose another")


def convert(
    hf_dir: Path, out: Path, flavor: str | None = None, dtype: str = "float32", strict: bool = True
) -> hf.HFCheckpoint:
    import torch.distributed.checkpoint as dcp

    check_out_dir(out)
    if flavor is not None and flavor not in MODEL_FLAVORS:
        raise ValueError(f"unknown flavor '{flavor}'; choose one of: {', '.join(MODEL_FLAVORS)}")
    ckpt = hf.inspect_hf_checkpoint(hf_dir, strict=strict)
    if flavor is not None:
        hf.check_compatible(ckpt.args, MODEL_FLAVORS[flavor], f"flavor {flavor}")
    sd = {}
    for path in ckpt.files:
        sd.update(hf.read_hf_file(path, ckpt.args, ckpt.tie_word_embeddings, DTYPES[dtype]))
    hf.check_keys(sd, hf.expected_shapes(ckpt.args), f"converted {hf_dir}")

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": sd}, checkpoint_id=str(tmp), no_dist=True)
    check_out_dir(out)
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return ckpt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hf", required=True, type=Path, help="HF folder (config.json + safetensors)")
    p.add_argument("--out", required=True, type=Path, help="DCP checkpoint folder to create")
    p.add_argument("--flavor", help="fail unless the HF config matches this flavor exactly")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument(
        "--no-strict",
        action="store_true",
        help="ignore safetensors entries that are not Llama parameters",
    )
    a = p.parse_args(argv)
    try:
        ckpt = convert(a.hf, a.out, a.flavor, a.dtype, strict=not a.no_strict)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"error: {e}; install the hf extra: pip install -e '.[hf]'", file=sys.stderr)
        return 1
    n = ckpt.args.num_params()
    print(f"imported {a.hf} ({n:,} parameters, {len(ckpt.files)} file(s)) to {a.out}")
    flavors = hf.matching_flavors(ckpt.args)
    if flavors:
        print(
            f"matches flavor {flavors[0]}: train with --model.flavor {flavors[0]} "
            f"--checkpoint.initial_load_path {a.out}"
        )
    else:
        print("matches none of the flavors (" + ", ".join(MODEL_FLAVORS) + ") exactly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
