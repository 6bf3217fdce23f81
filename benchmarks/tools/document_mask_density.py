"""How much attention each side of a document-masking row computes, counted on CPU.

Tokens/s under document masking depend on how long the documents of the measured steps are.
This counts, for the steps of a metrics window, the 128 x 128 FlexAttention blocks that a
document-causal mask leaves to compute on each side: ours (the bundled corpus, our tokenizer,
``--training.join_documents``) and the reference (its ``c4_test`` copy of the same corpus and its
test tokenizer, documents split after each EOS), packed the same way (BOS + text + EOS, windows
of seq_len + 1).

    python benchmarks/tools/document_mask_density.py --join 3 --steps 11-20 21-30
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from torchtitan.data.loader import build_dataloader
from torchtitan.data.tokenizer import load_tokenizer
from torchtitan.models.common.masks import document_block_mask, document_ids

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / ".peer" / "torchtitan" / "tests" / "assets"


def computed_blocks(positions: torch.Tensor) -> int:
    mask = document_block_mask(document_ids(positions))
    return int(mask.kv_num_blocks.sum() + mask.full_kv_num_blocks.sum())


def window_positions(starts: list[bool]) -> list[int]:
    positions, p = [], 0
    for i, start in enumerate(starts):
        p = 0 if i == 0 or start else p + 1
        positions.append(p)
    return positions


def reference_batches(seq_len: int, batch: int, steps: int) -> list[torch.Tensor]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(REFERENCE / "tokenizer" / "tokenizer.json"))
    starts: list[bool] = []
    need = (seq_len + 1) * batch * steps
    for line in open(REFERENCE / "c4_test" / "data.json"):
        length = len(tokenizer.encode(json.loads(line)["text"], add_special_tokens=False).ids)
        starts += [True] + [False] * (length + 1)  # BOS, the text, EOS
        if len(starts) >= need:
            break
    windows = [
        starts[w * (seq_len + 1) : (w + 1) * (seq_len + 1) - 1]
        for w in range(need // (seq_len + 1))
    ]
    rows = [window_positions(w) for w in windows]
    return [torch.tensor(rows[s * batch : (s + 1) * batch]) for s in range(steps)]


def our_batches(seq_len: int, batch: int, steps: int, join: int) -> list[torch.Tensor]:
    tokenizer = load_tokenizer(str(ROOT / "torchtitan" / "assets" / "tokenizer.model"))
    loader = build_dataloader(
        "sample",
        tokenizer,
        seq_len,
        batch,
        0,
        1,
        num_workers=0,
        join_documents=join,
        with_positions=True,
    )
    batches = iter(loader)
    return [next(batches).positions for _ in range(steps)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--join", type=int, default=3, help="our --training.join_documents")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2, help="local batch size")
    ap.add_argument("--steps", nargs="+", default=["11-20", "21-30"], help="step windows")
    args = ap.parse_args()
    windows = [tuple(map(int, w.split("-"))) for w in args.steps]
    last = max(hi for _, hi in windows)
    ours = our_batches(args.seq_len, args.batch, last, args.join)
    reference = reference_batches(args.seq_len, args.batch, last)
    print("| steps | side | mean document (tokens) | computed blocks | of causal |")
    print("|---|---|---|---|---|")
    causal_blocks = (args.seq_len // 128) * (args.seq_len // 128 + 1) // 2 * args.batch
    for lo, hi in windows:
        for side, batches in (("reference", reference), ("ours", ours)):
            chosen = batches[lo - 1 : hi]
            blocks = sum(computed_blocks(b) for b in chosen)
            documents = sum(int((b == 0).sum()) for b in chosen)
            tokens = sum(b.numel() for b in chosen)
            share = blocks / (causal_blocks * len(chosen))
            print(f"| {lo}–{hi} | {side} | {tokens / documents:,.0f} | {blocks:,} | {share:.2f} |")


if __name__ == "__main__":
    main()
