import base64
import time
from pathlib import Path

import pytest

from torchtitan.data.tokenizer import Tokenizer, TokenizerError

BUNDLED = Path(__file__).resolve().parents[2] / "torchtitan" / "assets" / "tokenizer.model"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(BUNDLED)


def write_ranks(path: Path, tokens: list[bytes]) -> Path:
    lines = [f"{base64.b64encode(t).decode()} {rank}" for rank, t in enumerate(tokens)]
    path.write_text("\n".join(lines) + "\n")
    return path


def single_bytes() -> list[bytes]:
    return [bytes([b]) for b in range(256)]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Hello, world!",
        "héllo wörld — naïve café, 日本語のテキスト, emoji 🙂🚀",
        "a   b\t\tc\n\n\n   d \r\n e    ",
        "1234567890 3.14159 2**64 = 18446744073709551616",
        "def f(x):\n    return {'k': [x, x ** 2]}  # comment\n",
        "\x00\x01 control bytes \x7f",
        " " * 60_000 + "x" * 70_000 + "\n" * 30_000 + "end",
    ],
)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text)
    assert all(0 <= i < tokenizer.num_base_tokens for i in ids)
    assert tokenizer.decode(ids) == text


def test_encode_batch_matches_encode(tokenizer):
    texts = ["first text", "", "x" * 30_000, "héllo  \n\n wörld"]
    expected = [tokenizer.encode(t, bos=True, eos=True) for t in texts]
    assert tokenizer.encode_batch(texts, bos=True, eos=True) == expected


def test_bundled_vocab_and_markers(tokenizer):
    assert tokenizer.num_base_tokens == 3840
    assert tokenizer.vocab_size == 4096
    assert (tokenizer.bos_id, tokenizer.eos_id) == (3840, 3841)
    ids = tokenizer.encode("hi", bos=True, eos=True)
    assert ids[0] == tokenizer.bos_id and ids[-1] == tokenizer.eos_id
    assert ids[1:-1] == tokenizer.encode("hi")


def test_special_tokens_names_and_ids(tokenizer):
    names = list(tokenizer.special_tokens)
    assert len(names) == 256
    assert names[:11] == [
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
    ]
    assert names[11] == "<|reserved_special_token_2|>"
    assert names[-1] == "<|reserved_special_token_246|>"
    assert list(tokenizer.special_tokens.values()) == list(range(3840, 4096))


def test_special_token_text_is_plain_text(tokenizer):
    text = "<|begin_of_text|>hello<|eot_id|>"
    ids = tokenizer.encode(text)
    assert all(i < tokenizer.num_base_tokens for i in ids)
    assert tokenizer.decode(ids) == text


def test_mini_tokenizer_ids(tmp_path):
    path = write_ranks(tmp_path / "mini.model", [*single_bytes(), b"ab", b"abc", b" ab"])
    tok = Tokenizer(path)
    assert tok.num_base_tokens == 259
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (259 + 256, 259, 260)
    assert tok.encode("ab") == [256]
    assert tok.encode("abc") == [257]
    assert tok.encode("abab ab") == [256, 256, 258]
    assert tok.encode("ba", bos=True, eos=True) == [259, ord("b"), ord("a"), 260]


def test_llama3_sized_file_ids_and_load_time(tmp_path):
    merges = [b"<%d>" % i for i in range(128_000 - 256)]
    path = write_ranks(tmp_path / "tokenizer.model", [*single_bytes(), *merges])
    # CPU time, not wall time: other tests share the CI cores. The bound catches a load that is
    # quadratic in the vocabulary (minutes at 128k), not a slowdown of a few percent.
    start = time.process_time()
    tok = Tokenizer(path)
    load_seconds = time.process_time() - start
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (128_256, 128_000, 128_001)
    assert tok.special_tokens["<|eot_id|>"] == 128_009
    assert tok.special_tokens["<|reserved_special_token_246|>"] == 128_255
    assert load_seconds < 20


@pytest.mark.parametrize(
    "contents, expected",
    [
        ("", "tokenizer file is empty"),
        ("\n  \n", "tokenizer file is empty"),
        ("YQ== 0\n!!!! 1\n", "line 2: invalid base64"),
        ("YQ== 0\nYg== one\n", "line 2: rank 'one' is not a non-negative integer"),
        ("YQ== 0\nYg== -1\n", "line 2: rank '-1' is not a non-negative integer"),
        ("YQ== 0\nYg== 0\n", "line 2: duplicate rank 0 (first on line 1)"),
        ("YQ== 0\nYQ== 1\n", "line 2: duplicate token"),
        ("YQ== 0\nYg==\n", "line 2: expected 'base64_token rank', got 1 fields"),
        ("YQ== 0\nYg== 2\n", "ranks are not contiguous: expected 0..1, rank 1 is missing"),
        ("YQ== 0\n", "255 of the 256 single-byte tokens are missing"),
    ],
)
def test_malformed_files_raise_one_line_errors(tmp_path, contents, expected):
    path = tmp_path / "bad.model"
    path.write_text(contents)
    with pytest.raises(TokenizerError) as error:
        Tokenizer(path)
    message = str(error.value)
    assert expected in message
    assert str(path) in message
    assert "\n" not in message


def test_missing_file_error(tmp_path):
    with pytest.raises(TokenizerError) as error:
        Tokenizer(tmp_path / "nope.model")
    message = str(error.value)
    assert message.startswith(f"tokenizer file not found: {tmp_path / 'nope.model'}")
    assert "--model.tokenizer_path" in message
    assert "\n" not in message
    assert isinstance(error.value, ValueError)
