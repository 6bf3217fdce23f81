"""Byte-level BPE tokenizer that reads Meta Llama 3 ``tokenizer.model`` files; ``load_tokenizer``
reads those and Hugging Face ``tokenizer.json`` files (``tokenizer_json.py``).

A ``tokenizer.model`` file has one line per base token, ``base64(token_bytes) rank``, with ranks
0..N-1. The 256 Llama 3.1 special tokens follow the base tokens (ids N..N+255), so a real Llama 3
file gives ``<|begin_of_text|>`` = 128000 and ``<|end_of_text|>`` = 128001.
"""

import base64
import binascii
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import tiktoken

from torchtitan.data.errors import TokenizerError
from torchtitan.data.tokenizer_json import JsonTokenizer, is_tokenizer_json
from torchtitan.paths import shown

__all__ = ["JsonTokenizer", "Tokenizer", "TokenizerError", "load_tokenizer"]

LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
NUM_SPECIAL_TOKENS = 256
NAMED_SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)

# tiktoken's regex and BPE get very slow on huge inputs and on long runs of only whitespace or
# only non-whitespace, so text is encoded in pieces that avoid both.
MAX_PIECE_CHARS = 400_000
MAX_RUN_CHARS = 25_000
LONG_RUN = re.compile(rf"\s{{{MAX_RUN_CHARS + 1},}}|\S{{{MAX_RUN_CHARS + 1},}}")


def special_token_names() -> list[str]:
    reserved_start = 2  # reserved_special_token_0 and _1 are among the named tokens
    num_reserved = NUM_SPECIAL_TOKENS - len(NAMED_SPECIAL_TOKENS)
    reserved = [f"<|reserved_special_token_{reserved_start + i}|>" for i in range(num_reserved)]
    return [*NAMED_SPECIAL_TOKENS, *reserved]


def parse_rank_line(line: bytes, line_number: int, path: Path) -> tuple[bytes, int]:
    fields = line.split()
    if len(fields) != 2:
        raise TokenizerError(
            f"{path}: line {line_number}: expected 'base64_token rank', got {len(fields)} fields"
        )
    encoded, rank_text = (field.decode("ascii", "replace") for field in fields)
    try:
        token = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise TokenizerError(
            f"{path}: line {line_number}: invalid base64 token {encoded[:40]!r}"
        ) from None
    if not token:
        raise TokenizerError(f"{path}: line {line_number}: token is empty")
    if not (rank_text.isascii() and rank_text.isdigit()):
        raise TokenizerError(
            f"{path}: line {line_number}: rank {rank_text[:40]!r} is not a non-negative integer"
        )
    return token, int(rank_text)


def read_rank_file(path: Path) -> bytes:
    if not path.is_file():
        raise TokenizerError(
            f"tokenizer file not found: {shown(path)}; pass --model.tokenizer_path with a Llama 3 "
            "tokenizer.model or a Hugging Face tokenizer.json file"
        )
    if is_tokenizer_json(path):
        raise TokenizerError(
            f"{shown(path)} is a Hugging Face tokenizer.json, not a Llama 3 tokenizer.model; "
            "read it with torchtitan.data.tokenizer.load_tokenizer"
        )
    contents = path.read_bytes()
    if not contents.strip():
        raise TokenizerError(f"{path}: tokenizer file is empty")
    return contents


def check_contiguous(ranks: dict[bytes, int], path: Path) -> None:
    present = set(ranks.values())
    if len(present) == len(ranks) and max(present) == len(ranks) - 1:
        return
    first_missing = next(r for r in range(len(ranks)) if r not in present)
    raise TokenizerError(
        f"{path}: ranks are not contiguous: expected 0..{len(ranks) - 1}, rank {first_missing} "
        "is missing"
    )


def check_all_single_bytes(ranks: dict[bytes, int], path: Path) -> None:
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise TokenizerError(
            f"{path}: {len(missing)} of the 256 single-byte tokens are missing "
            f"(first: byte 0x{missing[0]:02x})"
        )


def load_ranks(path: str | os.PathLike) -> dict[bytes, int]:
    """Parse and validate a tokenizer.model file into ``{token_bytes: rank}``."""
    path = Path(path).expanduser()
    ranks: dict[bytes, int] = {}
    line_of_rank: dict[int, int] = {}
    for line_number, line in enumerate(read_rank_file(path).splitlines(), start=1):
        if not line.strip():
            continue
        token, rank = parse_rank_line(line, line_number, path)
        if rank in line_of_rank:
            raise TokenizerError(
                f"{path}: line {line_number}: duplicate rank {rank} "
                f"(first on line {line_of_rank[rank]})"
            )
        if token in ranks:
            raise TokenizerError(f"{path}: line {line_number}: duplicate token {token[:40]!r}")
        ranks[token] = rank
        line_of_rank[rank] = line_number
    check_contiguous(ranks, path)
    check_all_single_bytes(ranks, path)
    return ranks


def split_long_runs(text: str) -> Iterator[str]:
    start = 0
    for run in LONG_RUN.finditer(text):
        run_start, run_end = run.span()
        for cut in range(run_start + MAX_RUN_CHARS, run_end, MAX_RUN_CHARS):
            yield text[start:cut]
            start = cut
    yield text[start:]


def encodable_pieces(text: str) -> Iterator[str]:
    """Cut text into pieces of at most MAX_PIECE_CHARS with no run longer than MAX_RUN_CHARS."""
    if len(text) <= MAX_RUN_CHARS:
        yield text
        return
    for start in range(0, len(text), MAX_PIECE_CHARS):
        yield from split_long_runs(text[start : start + MAX_PIECE_CHARS])


class Tokenizer:
    """Llama 3 style tokenizer: tiktoken BPE over the file's base tokens plus 256 specials."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        ranks = load_ranks(self.path)
        self.num_base_tokens = len(ranks)
        self.special_tokens = {
            name: self.num_base_tokens + i for i, name in enumerate(special_token_names())
        }
        self.vocab_size = self.num_base_tokens + NUM_SPECIAL_TOKENS
        self.bos_id = self.special_tokens["<|begin_of_text|>"]
        self.eos_id = self.special_tokens["<|end_of_text|>"]
        self.encoding = tiktoken.Encoding(
            name=self.path.name,
            pat_str=LLAMA3_SPLIT_PATTERN,
            mergeable_ranks=ranks,
            special_tokens=self.special_tokens,
        )

    def _with_markers(self, ids: list[int], bos: bool, eos: bool) -> list[int]:
        return [self.bos_id] * bos + ids + [self.eos_id] * eos

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """Encode text; special-token text inside it is encoded as ordinary text."""
        ids = []
        for piece in encodable_pieces(text):
            ids.extend(self.encoding.encode_ordinary(piece))
        return self._with_markers(ids, bos, eos)

    def encode_batch(
        self, texts: Sequence[str], bos: bool = False, eos: bool = False
    ) -> list[list[int]]:
        """Like ``encode`` for many texts, using tiktoken's multi-threaded batch encoder."""
        pieces, owners = [], []
        for index, text in enumerate(texts):
            for piece in encodable_pieces(text):
                pieces.append(piece)
                owners.append(index)
        results: list[list[int]] = [[] for _ in texts]
        for index, ids in zip(owners, self.encoding.encode_ordinary_batch(pieces)):
            results[index].extend(ids)
        return [self._with_markers(ids, bos, eos) for ids in results]

    def decode(self, ids: Sequence[int]) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return self.encoding.decode(ids)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a character may span several tokens)."""
        return self.encoding.decode_single_token_bytes(token_id)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer | JsonTokenizer:
    """The tokenizer in ``path`` (``--model.tokenizer_path``): a Llama 3 ``tokenizer.model``, or a
    Hugging Face ``tokenizer.json`` (read by the ``tokenizers`` library, if installed)."""
    path = Path(path).expanduser()
    return JsonTokenizer(path) if path.is_file() and is_tokenizer_json(path) else Tokenizer(path)
