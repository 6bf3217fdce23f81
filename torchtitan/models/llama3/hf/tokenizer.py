"""Our Llama 3 tokenizer (``torchtitan.data.tokenizer``) as Hugging Face tokenizer files.

``tokenizer.json`` is a ``tokenizers`` byte-level BPE: the same split regex, the base tokens as the
vocabulary, and merges derived from the ranks (each token of two or more bytes is the merge of
every pair of shorter tokens that concatenate to it, in rank order: the merge tiktoken would make
at that rank). ``ignore_merges`` emits a pre-tokenized piece that is itself a token directly, as
tiktoken does. The 256 special tokens follow the base tokens; a post-processor prepends BOS, as
our documents start with it. ``tokenizer_config.json`` sets ``split_special_tokens``, so that text
such as ``<|end_of_text|>`` inside a prompt is encoded as ordinary text, like ours does.

``tokenizers`` (installed with transformers) and our tokenizer module (with the data package)
are imported only when the files are built.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from torchtitan.data.tokenizer_json import byte_level_alphabet

if TYPE_CHECKING:
    from torchtitan.data.tokenizer import Tokenizer

__all__ = ["build_hf_tokenizer", "byte_level_alphabet", "tokenizer_config", "write_hf_tokenizer"]

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def bpe_vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level vocabulary (token text -> id = rank) and merges (highest priority first)."""
    alphabet = byte_level_alphabet()

    def text(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = []
    for token, _ in sorted(ranks.items(), key=lambda item: item[1]):
        pairs = [(token[:i], token[i:]) for i in range(1, len(token))]
        pairs = [(a, b) for a, b in pairs if a in ranks and b in ranks]
        pairs.sort(key=lambda pair: (ranks[pair[0]], ranks[pair[1]]))
        merges.extend((text(a), text(b)) for a, b in pairs)
    return vocab, merges


def build_hf_tokenizer(tokenizer: Tokenizer):
    """A ``tokenizers.Tokenizer`` that encodes and decodes like ``tokenizer``."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    from torchtitan.data.tokenizer import LLAMA3_SPLIT_PATTERN, load_ranks

    vocab, merges = bpe_vocab_and_merges(load_ranks(tokenizer.path))
    hf_tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    hf_tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf_tok.decoder = decoders.ByteLevel()
    specials = sorted(tokenizer.special_tokens, key=tokenizer.special_tokens.get)
    hf_tok.add_special_tokens(
        [AddedToken(name, special=True, normalized=False) for name in specials]
    )
    for name, token_id in tokenizer.special_tokens.items():
        if hf_tok.token_to_id(name) != token_id:
            raise ValueError(
                f"special token {name} got id {hf_tok.token_to_id(name)}, not {token_id}"
            )
    bos = "<|begin_of_text|>"
    hf_tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos}:0 $A:0",
                pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                special_tokens=[(bos, tokenizer.bos_id)],
            ),
        ]
    )
    return hf_tok


def tokenizer_config(tokenizer: Tokenizer, model_max_length: int) -> dict:
    """tokenizer_config.json for ``transformers.AutoTokenizer``."""
    names = {i: name for name, i in tokenizer.special_tokens.items()}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": names[tokenizer.bos_id],
        "eos_token": names[tokenizer.eos_id],
        "model_max_length": model_max_length,
        "model_input_names": ["input_ids", "attention_mask"],
        "clean_up_tokenization_spaces": False,  # decode must give back the text exactly
        "split_special_tokens": True,
    }


def write_hf_tokenizer(tokenizer: Tokenizer, folder: str | Path, model_max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json into ``folder``."""
    folder = Path(folder)
    build_hf_tokenizer(tokenizer).save(str(folder / TOKENIZER_FILE))
    config = tokenizer_config(tokenizer, model_max_length)
    (folder / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
