"""Hugging Face ``tokenizer.json`` files, read with the ``tokenizers`` library (optional).

``JsonTokenizer`` has the interface the data pipeline, the trainer and generation use (like
``tokenizer.Tokenizer``): ``vocab_size``, ``bos_id``, ``eos_id``, ``special_tokens``, ``encode``,
``encode_batch``, ``decode``, ``token_bytes``. BOS and EOS are those of a
``tokenizer_config.json`` beside the file, else the first special token of the usual names
(``<|begin_of_text|>``, ``<s>``, ...); a tokenizer with an end-of-text token only (GPT-2 style)
uses it for both. Text that spells a special token is encoded as ordinary text, as ours does.
Without ``tokenizers`` the error is one line naming what to install.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from torchtitan.data.errors import TokenizerError
from torchtitan.paths import shown

INSTALL = 'pip install tokenizers (or pip install -e ".[scripts]")'
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<|startoftext|>", "<bos>")
EOS_NAMES = ("<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>")
BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def is_tokenizer_json(path: Path) -> bool:
    """A ``.json`` file, or one whose text starts with ``{`` (a ``tokenizer.model`` never does)."""
    if path.suffix.lower() == ".json":
        return True
    with open(path, "rb") as f:
        return f.read(64).lstrip()[:1] == b"{"


def byte_level_alphabet() -> dict[int, str]:
    """The byte-level BPE convention: each byte as one printable character. Printable Latin-1
    bytes stand for themselves; the other 68 map to U+0100, U+0101, ... in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    alphabet = {b: chr(b) for b in printable}
    for offset, b in enumerate(b for b in range(256) if b not in alphabet):
        alphabet[b] = chr(0x100 + offset)
    return alphabet


def _config_token(config: dict, key: str) -> str | None:
    value = config.get(key)
    return value.get("content") if isinstance(value, dict) else value


class JsonTokenizer:
    """A Hugging Face ``tokenizer.json``; see the module doc."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            from tokenizers import Tokenizer as HFTokenizer
            from tokenizers import decoders
        except ImportError:
            raise TokenizerError(
                f"{shown(self.path)} is a Hugging Face tokenizer.json; reading it needs the "
                f"tokenizers library: {INSTALL}"
            ) from None
        try:
            self._tokenizer = HFTokenizer.from_file(str(self.path))
        except Exception as e:
            first = str(e).strip().splitlines()[:1] or [type(e).__name__]
            raise TokenizerError(
                f"{shown(self.path)}: not a readable tokenizer.json ({first[0]})"
            ) from None
        self._tokenizer.encode_special_tokens = True  # "<|end_of_text|>" in text is text
        vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1
        self.num_base_tokens = self._tokenizer.get_vocab_size(with_added_tokens=False)
        added = self._tokenizer.get_added_tokens_decoder()
        self.special_tokens = {t.content: i for i, t in sorted(added.items()) if t.special}
        self.bos_id, self.eos_id = self._markers(vocab)
        self._byte_level = isinstance(self._tokenizer.decoder, decoders.ByteLevel)
        self._bytes_of = {c: b for b, c in byte_level_alphabet().items()}

    def _markers(self, vocab: dict[str, int]) -> tuple[int, int]:
        """(BOS id, EOS id): ``tokenizer_config.json``'s, else the usual names."""
        config_file = self.path.with_name("tokenizer_config.json")
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        bos = _config_token(config, "bos_token") or next((n for n in BOS_NAMES if n in vocab), None)
        eos = _config_token(config, "eos_token") or next((n for n in EOS_NAMES if n in vocab), None)
        if eos not in vocab:
            raise TokenizerError(
                f"{shown(self.path)} has no end-of-text token (none of {', '.join(EOS_NAMES)}, "
                "nor an eos_token in a tokenizer_config.json beside it)"
            )
        return vocab[bos if bos in vocab else eos], vocab[eos]

    def _with_markers(self, ids: list[int], bos: bool, eos: bool) -> list[int]:
        return [self.bos_id] * bos + ids + [self.eos_id] * eos

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return self._with_markers(ids, bos, eos)

    def encode_batch(
        self, texts: Sequence[str], bos: bool = False, eos: bool = False
    ) -> list[list[int]]:
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [self._with_markers(e.ids, bos, eos) for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: exact for byte-level BPE and byte-fallback tokens;
        a SentencePiece ``▁`` is a space."""
        token = self._tokenizer.id_to_token(token_id) or ""
        if token_id in self.special_tokens.values():
            return token.encode()
        if self._byte_level and all(c in self._bytes_of for c in token):
            return bytes(self._bytes_of[c] for c in token)
        if match := BYTE_FALLBACK.match(token):
            return bytes([int(match.group(1), 16)])
        return token.replace("\u2581", " ").encode()
