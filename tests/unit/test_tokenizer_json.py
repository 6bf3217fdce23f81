"""A Hugging Face tokenizer.json as --model.tokenizer_path (torchtitan/data/tokenizer_json.py):
read with the tokenizers library, or refused in one line naming what to install. The files are
made here, offline: the bundled tokenizer exported by write_hf_tokenizer, and a GPT-2 style BPE
trained on a few sentences."""

from __future__ import annotations

import codecs
import sys

import pytest

from tests.unit.test_hf_tokenizer import BUNDLED, TEXTS
from torchtitan.data import build_dataloader
from torchtitan.data.tokenizer import JsonTokenizer, Tokenizer, TokenizerError, load_tokenizer
from torchtitan.preflight import main as preflight

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return Tokenizer(BUNDLED)


@pytest.fixture(scope="module")
def exported(ours, tmp_path_factory):
    """The bundled tokenizer as tokenizer.json + tokenizer_config.json."""
    from torchtitan.models.llama3.hf.tokenizer import write_hf_tokenizer

    folder = tmp_path_factory.mktemp("tok")
    write_hf_tokenizer(ours, folder, model_max_length=2048)
    return folder / "tokenizer.json"


def streamed(tokenizer, ids: list[int]) -> str:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return "".join(decoder.decode(tokenizer.token_bytes(i)) for i in ids) + decoder.decode(
        b"", final=True
    )


def test_a_tokenizer_json_encodes_decodes_and_streams_like_ours(ours, exported):
    theirs = load_tokenizer(exported)
    assert isinstance(theirs, JsonTokenizer)
    assert (theirs.vocab_size, theirs.bos_id, theirs.eos_id) == (
        ours.vocab_size,
        ours.bos_id,
        ours.eos_id,
    )
    for name, text in TEXTS.items():
        ids = ours.encode(text, bos=True, eos=True)
        assert theirs.encode(text, bos=True, eos=True) == ids, name  # specials in text are text
        assert theirs.decode(ids[1:-1]) == text and streamed(theirs, ids[1:-1]) == text, name
    assert theirs.encode_batch(list(TEXTS.values())) == ours.encode_batch(list(TEXTS.values()))
    windows = build_dataloader("sample", theirs, 16, 2, 0, 1)  # the training pipeline takes it
    assert next(iter(windows))[0].shape == (2, 16)


def test_without_its_config_bos_and_eos_are_found_by_name(ours, exported, tmp_path):
    alone = tmp_path / "tokenizer.json"
    alone.write_bytes(exported.read_bytes())
    assert (JsonTokenizer(alone).bos_id, JsonTokenizer(alone).eos_id) == (ours.bos_id, ours.eos_id)


def test_a_gpt2_style_tokenizer_uses_its_end_of_text_as_both(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    hf.train_from_iterator(list(TEXTS.values()) * 3, trainer)
    path = tmp_path / "gpt2.json"
    hf.save(str(path))
    tok = load_tokenizer(path)
    assert tok.bos_id == tok.eos_id == hf.token_to_id("<|endoftext|>")
    text = TEXTS["unicode"] + TEXTS["emoji"]
    assert tok.decode(tok.encode(text)) == text == streamed(tok, tok.encode(text))


def test_preflight_takes_a_tokenizer_json_and_names_the_missing_library(
    exported, capsys, monkeypatch
):
    assert preflight(["--model.tokenizer_path", str(exported)]) == 0
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers: ImportError
    assert preflight(["--model.tokenizer_path", str(exported)]) == 2
    assert capsys.readouterr().err == (
        f"error: {exported} is a Hugging Face tokenizer.json; reading it needs the tokenizers "
        'library: pip install tokenizers (or pip install -e ".[scripts]")\n'
    )


def test_the_llama3_reader_recognises_a_tokenizer_json(exported, tmp_path):
    with pytest.raises(TokenizerError, match="is a Hugging Face tokenizer.json, not a Llama 3"):
        Tokenizer(exported)
    garbled = tmp_path / "tokenizer.json"
    garbled.write_text('{"model": 3}')
    with pytest.raises(TokenizerError, match=r"not a readable tokenizer.json \("):
        load_tokenizer(garbled)
