"""Train the bundled byte-level BPE tokenizer and write it in Llama 3 ``tokenizer.model`` format.

Trains with Hugging Face ``tokenizers`` (needed by this script only) using the Llama 3 split regex
and all 256 bytes as the initial alphabet, then writes one ``base64(token_bytes) rank`` line per
token, with the trainer's token id as the rank. The last ``--holdout-docs`` documents are kept out
of training and used to check that ``torchtitan.data.tokenizer.Tokenizer`` (tiktoken) reading the
written file encodes them exactly like the trained Hugging Face tokenizer.

The committed file was generated from the repository root with:

    python scripts/train_tokenizer.py --corpus torchtitan/assets/sample_corpus.jsonl \\
        --vocab-size 3840 --out torchtitan/assets/tokenizer.model
"""

import argparse
import base64
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from torchtitan.data.tokenizer import LLAMA3_SPLIT_PATTERN, Tokenizer  # noqa: E402


def byte_level_alphabet() -> dict[str, int]:
    """Map GPT-2 byte-level characters (as used by HF ByteLevel) back to raw byte values."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    char_to_byte = {chr(b): b for b in printable}
    unprintable = [b for b in range(256) if b not in printable]
    for offset, b in enumerate(unprintable):
        char_to_byte[chr(256 + offset)] = b
    return char_to_byte


def read_texts(corpus: Path) -> list[str]:
    with corpus.open(encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def train_hf_tokenizer(texts: list[str], vocab_size: int):
    try:
        from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise SystemExit(
            "this script needs Hugging Face tokenizers: pip install tokenizers"
        ) from None
    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def ranks_from_hf_vocab(vocab: dict[str, int], vocab_size: int) -> dict[bytes, int]:
    char_to_byte = byte_level_alphabet()
    ranks = {bytes(char_to_byte[c] for c in token): rank for token, rank in vocab.items()}
    if len(ranks) != len(vocab):
        raise SystemExit("two trained tokens map to the same bytes")
    if sorted(ranks.values()) != list(range(vocab_size)):
        raise SystemExit(f"trained ranks are not 0..{vocab_size - 1}; corpus too small?")
    if any(bytes([b]) not in ranks for b in range(256)):
        raise SystemExit("a single-byte token is missing from the trained vocabulary")
    return ranks


def write_tokenizer_model(ranks: dict[bytes, int], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = (
        f"{base64.b64encode(token).decode()} {rank}\n"
        for token, rank in sorted(ranks.items(), key=lambda item: item[1])
    )
    out.write_text("".join(lines), encoding="ascii")


def verify_same_encoding(hf_tokenizer, out: Path, texts: list[str]) -> None:
    tokenizer = Tokenizer(out)
    for index, text in enumerate(texts):
        if tokenizer.encode(text) != hf_tokenizer.encode(text).ids:
            raise SystemExit(f"held-out document {index}: tiktoken and HF encodings differ")
        if tokenizer.decode(tokenizer.encode(text)) != text:
            raise SystemExit(f"held-out document {index}: decode(encode(text)) != text")
    num_bytes = sum(len(t.encode()) for t in texts)
    num_tokens = sum(len(tokenizer.encode(t)) for t in texts)
    print(
        f"ok: {len(texts)} held-out documents encode identically "
        f"({num_bytes / num_tokens:.2f} bytes/token); vocab_size={tokenizer.vocab_size}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpus", type=Path, default=Path("torchtitan/assets/sample_corpus.jsonl")
    )
    parser.add_argument("--vocab-size", type=int, default=3840, help="base tokens, no specials")
    parser.add_argument("--out", type=Path, default=Path("torchtitan/assets/tokenizer.model"))
    parser.add_argument("--holdout-docs", type=int, default=50)
    args = parser.parse_args()
    texts = read_texts(args.corpus)
    train_texts, heldout_texts = texts[: -args.holdout_docs], texts[-args.holdout_docs :]
    hf_tokenizer = train_hf_tokenizer(train_texts, args.vocab_size)
    ranks = ranks_from_hf_vocab(hf_tokenizer.get_vocab(), args.vocab_size)
    write_tokenizer_model(ranks, args.out)
    print(f"wrote {len(ranks)} base tokens to {args.out}")
    verify_same_encoding(hf_tokenizer, args.out, heldout_texts)


if __name__ == "__main__":
    main()
