"""Export a torchtitan DCP checkpoint to a Hugging Face folder: ``LlamaForCausalLM`` (Llama 3),
``Qwen3ForCausalLM`` or ``Qwen3MoeForCausalLM`` (``--model-name qwen3``).

    python scripts/convert_to_hf.py --checkpoint outputs/checkpoint --out my_llama_hf
    python scripts/convert_to_hf.py --checkpoint outputs/checkpoint/step-1000 --flavor 8B \\
        --out my_llama_hf --dtype bfloat16
    python scripts/convert_to_hf.py --model-name qwen3 --checkpoint outputs/checkpoint \\
        --flavor 30B-A3B --out my_qwen3_hf

``--checkpoint`` is one DCP checkpoint folder (``step-N``, holding ``.metadata``) or a folder of
them (``--step N`` picks one, default the highest step). Only its model weights (keys
``model.*``) are read; optimizer state and the rest are ignored. ``--model-name`` (default
llama3) is the family, as the trainer's ``--model.name``. The flavor is inferred from the stored
shapes when ``--flavor`` is omitted and exactly one flavor fits (Qwen3's tied and untied debug
flavors have the same shapes: the stored head decides). A tied Qwen3 head is written once
(``tie_word_embeddings``); each MoE router's ``expert_bias`` has no HF counterpart and is dropped
(a printed note gives its largest magnitude: nonzero, transformers routes some tokens to other
experts than the trained model).

Writes ``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index
.json`` above ``--max-shard-size``), ``config.json``, ``generation_config.json`` and the tokenizer
(``tokenizer.json``, ``tokenizer_config.json``) of ``--tokenizer``, by default the bundled one when
the model's vocab_size is its 4096. The folder loads with
``AutoModelForCausalLM.from_pretrained(OUT)`` and ``AutoTokenizer.from_pretrained(OUT)``. Each
shard's tensors are read from the checkpoint, converted and written in turn, so memory use is
about one shard in the checkpoint's dtype plus one in the output dtype (Llama 3.2 1B, fp32 ->
bf16, 1GB shards: 3.3 GB peak). The output is written to ``OUT.tmp`` and renamed, and an
existing non-empty ``OUT`` is never touched.
See docs/hf_interop.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path[:0] = [str(SCRIPTS.parent), str(SCRIPTS)]

import torch  # noqa: E402
from _hf_cli import (  # noqa: E402
    HF_FAMILIES,
    HFFamily,
    check_out_dir,
    fresh_temporary,
    publish,
    run_cli,
)

from torchtitan.checkpoint import find_checkpoint, load_safely  # noqa: E402
from torchtitan.config import ASSETS  # noqa: E402
from torchtitan.data.tokenizer import Tokenizer  # noqa: E402
from torchtitan.dtypes import DTYPES, dtype_from_name  # noqa: E402
from torchtitan.inference.weights import dcp_model_tensors as checkpoint_tensors  # noqa: E402
from torchtitan.models.llama3.hf import (  # noqa: E402
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    SAFETENSORS_FILE,
    SAFETENSORS_INDEX_FILE,
)
from torchtitan.models.llama3.hf.tokenizer import write_hf_tokenizer  # noqa: E402

BUNDLED_TOKENIZER = ASSETS / "tokenizer.model"


def parse_override(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"--override expects KEY=VALUE, got '{text}'")
    lowered = value.lower()
    if lowered in ("true", "false"):
        return key, lowered == "true"
    for cast in (int, float):
        try:
            return key, cast(value)
        except ValueError:
            pass
    return key, value


def _shapes_only(tensors: dict) -> dict[str, tuple[int, ...]]:
    return {k: shape for k, (shape, _) in tensors.items()}


def _ties(args) -> bool:
    return bool(getattr(args, "tie_embeddings", False))


def stored_tied(ckpt: Path, tensors: dict) -> bool:
    """Whether the checkpoint's head is its embedding table (a tied model saves the one table
    under both names)."""
    names = ["tok_embeddings.weight", "output.weight"]
    if any(n not in tensors for n in names) or tensors[names[0]][0] != tensors[names[1]][0]:
        return False
    embeddings, head = load_from_dcp(ckpt, names, tensors).values()
    return torch.equal(embeddings, head)


def stored_family(shapes: dict) -> str:
    """The family whose tensors the checkpoint holds: DeepSeek-V3 normalizes its KV latent,
    Qwen3 its queries and keys."""
    if any(k.endswith("attention.kv_norm.weight") for k in shapes):
        return "deepseek_v3"
    return "qwen3" if any(k.endswith("attention.q_norm.weight") for k in shapes) else "llama3"


def infer_flavor(family: HFFamily, tensors: dict, overrides: dict, ckpt: Path) -> str:
    """The one flavor (with ``overrides``) whose shapes are the checkpoint's; the tied and the
    untied flavor of the same shapes are told apart by the stored head."""
    shapes = _shapes_only(tensors)
    fits = []
    for name in family.flavors:
        try:
            candidate = family.get_model_args(name, **overrides)
        except ValueError:
            continue
        if family.hf.expected_shapes(candidate) == shapes:
            fits.append((name, _ties(candidate)))
    if len({tied for _, tied in fits}) > 1:
        tied = stored_tied(ckpt, tensors)
        fits = [(name, t) for name, t in fits if t == tied]
    if len(fits) != 1:
        found = f"flavors {', '.join(n for n, _ in fits)} all fit" if fits else "no flavor fits"
        raise ValueError(f"{found} the shapes in {ckpt}; pass --flavor (and --override)")
    return fits[0][0]


def resolve_args(
    tensors: dict,
    flavor: str | None,
    overrides: dict,
    ckpt: Path,
    family: HFFamily = HF_FAMILIES["llama3"],
) -> tuple[str, object]:
    """The flavor (given, or the only one whose shapes fit) and its args, checked against the
    checkpoint's shapes."""
    shapes = _shapes_only(tensors)
    if (stored := stored_family(shapes)) != family.name:
        raise ValueError(
            f"checkpoint {ckpt} holds a {HF_FAMILIES[stored].title} model; pass --model-name "
            f"{stored}"
        )
    if flavor is None:
        flavor = infer_flavor(family, tensors, overrides, ckpt)
    args = family.get_model_args(flavor, **overrides)
    family.hf.check_keys(shapes, family.hf.expected_shapes(args), f"checkpoint {ckpt} (model.*)")
    family.hf.check_shapes(shapes, args, f"checkpoint {ckpt} vs flavor {flavor}")
    if _ties(args) and not stored_tied(ckpt, tensors):
        raise ValueError(
            f"flavor {flavor} ties the output head to the embedding table, but in {ckpt} they "
            "differ; pass the untied flavor"
        )
    return flavor, args


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", text.upper())
    if not m:
        raise ValueError(f"--max-shard-size expects e.g. 5GB or 500MB, got '{text}'")
    unit = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9}
    return int(float(m.group(1)) * unit[m.group(2)])


def plan_shards(names: list[str], nbytes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """Consecutive groups of at most max_bytes (a single larger tensor gets its own shard)."""
    shards, current, size = [], [], 0
    for name in names:
        if current and size + nbytes[name] > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes[name]
    if current:
        shards.append(current)
    return shards


def load_from_dcp(ckpt: Path, names: list[str], tensors: dict) -> dict[str, torch.Tensor]:
    """The tensors ``names`` of the checkpoint's model, in their stored dtype."""
    state = {
        "model": {n: torch.empty(tensors[n][0], dtype=tensors[n][1]) for n in names},
    }
    load_safely(state, ckpt)
    return state["model"]


def exported_names(hf, args, tensors: dict) -> tuple[list[str], list[str]]:
    """(our tensors that become HF tensors, in HF's usual order: embeddings, layers, norm, head;
    those that have no HF counterpart: MoE routers' expert_bias). A tied head is in neither:
    HF stores the embedding table once."""
    exported, dropped = [], []
    for name in hf.expected_shapes(args):
        if hf.to_hf_tensors(name, torch.empty(tensors[name][0], device="meta"), args):
            exported.append(name)
        elif not (name == "output.weight" and _ties(args)):
            dropped.append(name)
    return exported, dropped


def write_weights(
    tmp: Path, ckpt: Path, tensors: dict, hf, args, torch_dtype: torch.dtype, max_shard_bytes: int
) -> None:
    """The safetensors file(s), and the index when there are several, each shard read from the
    checkpoint, converted and written in turn."""
    from safetensors.torch import save_file

    names, _ = exported_names(hf, args, tensors)
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    nbytes = {n: itemsize * torch.Size(tensors[n][0]).numel() for n in names}
    shards = plan_shards(names, nbytes, max_shard_bytes)
    umask = os.umask(0)
    os.umask(umask)
    weight_map = {}
    for i, group in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        fname = SAFETENSORS_FILE if len(shards) == 1 else fname
        ours = load_from_dcp(ckpt, group, tensors)
        converted = {}
        for name in group:
            for hf_key, t in hf.to_hf_tensors(name, ours.pop(name), args).items():
                converted[hf_key] = t.to(torch_dtype).contiguous()
                weight_map[hf_key] = fname
        save_file(converted, str(tmp / fname), metadata={"format": "pt"})
        os.chmod(tmp / fname, 0o666 & ~umask)  # safetensors creates it private (0600)
        print(f"wrote {fname} ({len(converted)} tensors)")
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(nbytes.values())}, "weight_map": weight_map}
        (tmp / SAFETENSORS_INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def dropped_note(ckpt: Path, tensors: dict, hf, args) -> str | None:
    """What the export leaves out (the MoE routers' expert_bias), for the summary."""
    _, dropped = exported_names(hf, args, tensors)
    if not dropped:
        return None
    largest = max(float(t.abs().max()) for t in load_from_dcp(ckpt, dropped, tensors).values())
    effect = (
        "all zero, so routing is unchanged"
        if largest == 0
        else f"largest |bias| {largest:.3g}: transformers routes some tokens to other experts "
        "than this checkpoint does"
    )
    return (
        f"note: dropped {len(dropped)} MoE router expert_bias buffer(s), which Hugging Face's "
        f"router lacks; {effect}"
    )


def convert(
    ckpt: Path,
    out: Path,
    flavor: str | None = None,
    overrides: dict | None = None,
    dtype: str = "bfloat16",
    max_shard_bytes: int = 5 * 10**9,
    tokenizer: Tokenizer | None = None,
    max_position_embeddings: int | None = None,
    family: HFFamily = HF_FAMILIES["llama3"],
) -> tuple[str, object, list[str]]:
    """-> (flavor, args, notes for the summary). Without ``tokenizer`` no tokenizer files are
    written and BOS/EOS follow the family's default (the Llama 3 layout, or Qwen's ids for
    Qwen's vocabulary)."""
    check_out_dir(out)
    tensors = checkpoint_tensors(ckpt)
    flavor, args = resolve_args(tensors, flavor, overrides or {}, ckpt, family)
    if tokenizer is not None and tokenizer.vocab_size > args.vocab_size:
        raise ValueError(
            f"tokenizer {tokenizer.path} has {tokenizer.vocab_size} tokens, more than the "
            f"model's vocab_size {args.vocab_size}; pass the --tokenizer it was trained with"
        )
    hf = family.hf
    config = hf.hf_config_dict(  # first: it refuses what HF cannot express (shared experts)
        args,
        dtype=dtype,
        bos_token_id=tokenizer.bos_id if tokenizer else None,
        eos_token_id=tokenizer.eos_id if tokenizer else None,
        max_position_embeddings=max_position_embeddings,
    )
    tmp = fresh_temporary(out)
    tmp.mkdir(parents=True)
    write_weights(tmp, ckpt, tensors, hf, args, dtype_from_name(dtype), max_shard_bytes)
    (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (tmp / GENERATION_CONFIG_FILE).write_text(json.dumps(generation, indent=2) + "\n")
    if tokenizer is not None:
        write_hf_tokenizer(tokenizer, tmp, config["max_position_embeddings"])
    publish(tmp, out)
    note = dropped_note(ckpt, tensors, hf, args)
    return flavor, args, [note] if note else []


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkpoint", required=True, type=Path, help="DCP checkpoint folder")
    p.add_argument("--step", type=int, help="read CHECKPOINT/step-N (default: the latest)")
    p.add_argument(
        "--model-name",
        default="llama3",
        choices=list(HF_FAMILIES),
        help="the model family, as the trainer's --model.name (default: llama3)",
    )
    p.add_argument("--flavor", help="model flavor (default: inferred from the stored shapes)")
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="replace a field of the flavor's args, e.g. n_layers=2 (repeatable)",
    )
    p.add_argument("--out", required=True, type=Path, help="HF folder to create")
    p.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    p.add_argument("--max-shard-size", default="5GB", help="largest safetensors file (5GB)")
    p.add_argument(
        "--tokenizer",
        help="Llama 3 format tokenizer.model to export as tokenizer.json + tokenizer_config.json "
        "(its BOS/EOS ids go into the configs); default: the bundled one when the model's "
        "vocab_size is its 4096, else none (BOS/EOS: vocab_size - 256 and - 255)",
    )
    p.add_argument("--no-tokenizer", action="store_true", help="write no tokenizer files")
    p.add_argument(
        "--max-position-embeddings",
        type=int,
        help="config.json max_position_embeddings (default: max_seq_len, 131072 with RoPE scaling)",
    )
    return p


def export(a: argparse.Namespace) -> str:
    """The conversion the command line asks for; -> the summary line."""
    ckpt = find_checkpoint(a.checkpoint, a.step)
    overrides = dict(parse_override(o) for o in a.override)
    if a.tokenizer and a.no_tokenizer:
        raise ValueError("--tokenizer and --no-tokenizer exclude each other")
    tokenizer = Tokenizer(a.tokenizer) if a.tokenizer else None
    if tokenizer is None and not a.no_tokenizer:
        bundled = Tokenizer(BUNDLED_TOKENIZER)
        vocab_size = checkpoint_tensors(ckpt).get("output.weight", ((0,), None))[0][0]
        tokenizer = bundled if vocab_size == bundled.vocab_size else None
    flavor, args, notes = convert(
        ckpt,
        a.out,
        a.flavor,
        overrides,
        a.dtype,
        parse_size(a.max_shard_size),
        tokenizer,
        a.max_position_embeddings,
        HF_FAMILIES[a.model_name],
    )
    summary = f"exported {ckpt} (flavor {flavor}, {args.num_params():,} parameters) to {a.out}"
    if tokenizer is None:
        summary += "; no tokenizer written (pass --tokenizer PATH/tokenizer.model)"
    else:
        summary += f" with the tokenizer {tokenizer.path}"
    return "\n".join([summary, *notes])


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    return run_cli(lambda: export(a))


if __name__ == "__main__":
    sys.exit(main())
