"""torchtitan.generate and the KV-cache path of the model: cached decoding against a full
forward, greedy parity with ``transformers``' ``generate`` on our HF export, EOS, seeded top-k
sampling, streamed UTF-8 text and the command line's one-line errors.

Measured (torch 2.13 CPU, fp32): cached and full-forward logits differ by at most 1.2e-6 (logits
up to 4.3); greedy ids from our DCP checkpoint, from its HF export read by us, and from
``LlamaForCausalLM.generate(do_sample=False)`` on that export are identical.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest
import torch

from tests.unit.test_hf import ROOT, SMALL, needs_transformers, random_model
from tests.unit.test_hf_scripts import script_main
from torchtitan import generate
from torchtitan.checkpoint import save_seed_checkpoint
from torchtitan.data.tokenizer import Tokenizer
from torchtitan.inference.generation import generate_tokens
from torchtitan.inference.graphed_decode import decode_step
from torchtitan.inference.sampling import Sampling, TokenSampler, nucleus
from torchtitan.models.llama3 import ModelArgs, get_model_args
from torchtitan.models.llama3.kv_cache import KVCache

CACHE_ATOL = 2e-5  # fp32; measured ~1e-6
PROMPT = "The tokenizer splits text into"
NEW_TOKENS = 24


def small_model(**overrides):
    return random_model(ModelArgs(**{**SMALL, **overrides}))


def greedy() -> TokenSampler:
    return TokenSampler(Sampling(temperature=0.0))


# ------------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("n_kv_heads", [2, None], ids=["gqa", "mha"])
def test_cached_decoding_matches_a_full_forward(n_kv_heads):
    """Prefill, single-token steps and a later multi-token chunk (explicit mask with an offset)
    give the logits of one forward over the whole sequence, for a batch of two."""
    model = small_model(n_kv_heads=n_kv_heads)
    x = torch.randint(0, model.args.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    cache = KVCache(model.args, batch_size=2, max_len=40)
    with torch.no_grad():
        full = model(x)
        pieces = [model(x[:, :10], cache=cache, start_pos=0)]
        pieces += [model(x[:, p : p + 1], cache=cache, start_pos=p) for p in range(10, 16)]
        pieces.append(model(x[:, 16:40], cache=cache, start_pos=16))
    cached = torch.cat(pieces, dim=1)
    assert full.abs().max() > 1.0
    assert (cached - full).abs().max().item() < CACHE_ATOL


@pytest.mark.parametrize("n_kv_heads", [2, None], ids=["gqa", "mha"])
def test_the_fixed_shape_step_matches_the_cached_forward(n_kv_heads):
    """``decode_step`` (what the CUDA graph replays: position as a tensor, attention over the
    whole cache under a mask) gives the cached forward's logits and stores the same keys."""
    model = small_model(n_kv_heads=n_kv_heads)
    x = torch.randint(0, model.args.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    caches = [KVCache(model.args, batch_size=1, max_len=32) for _ in range(2)]
    key_positions = torch.arange(32)
    with torch.no_grad():
        for cache in caches:
            model(x[:, :16], cache=cache, start_pos=0)
        for p in range(16, 24):
            want = model(x[:, p : p + 1], cache=caches[0], start_pos=p)[0, -1]
            got = decode_step(model, caches[1], x[:, p : p + 1], torch.tensor([p]), key_positions)[
                0
            ]
            assert want.abs().max() > 1.0
            assert (got - want).abs().max().item() < CACHE_ATOL, p
    for name, layer in caches[0].layers.items():
        torch.testing.assert_close(caches[1].layers[name].keys, layer.keys)
        torch.testing.assert_close(caches[1].layers[name].values, layer.values)


def test_cache_bounds_are_one_line_errors():
    model = small_model()
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len 128"):
        KVCache(model.args, batch_size=1, max_len=129)
    cache = KVCache(model.args, batch_size=1, max_len=8)
    with pytest.raises(ValueError, match=r"positions 6\.\.9 do not fit a KV cache of 8"):
        model(torch.zeros(1, 4, dtype=torch.long), cache=cache, start_pos=6)


# ------------------------------------------------------------------------ decoding loop


def test_eos_stops_generation():
    model = small_model()
    prompt = [1, 2, 3]
    free = list(generate_tokens(model, prompt, 12, greedy()))
    assert len(free) == 12
    stop_at = next(i for i in range(2, 12) if free[i] not in free[:i])
    stopped = list(generate_tokens(model, prompt, 12, greedy(), eos_id=free[stop_at]))
    assert stopped == free[: stop_at + 1]


def test_the_head_runs_on_the_last_position_only():
    """The prompt's pass sends one position through the head, not the whole prompt, and gets
    the logits a full forward gives there; the model is left as it was (head on)."""
    model = small_model()
    prompt = list(range(1, 31))
    head_inputs = []
    model.output.register_forward_hook(lambda m, args, out: head_inputs.append(args[0].shape))
    logits_seen = []

    class Recording(TokenSampler):
        def sample(self, logits):
            logits_seen.append(logits[0].clone())
            return super().sample(logits)

    ids = list(generate_tokens(model, prompt, 3, Recording(Sampling(temperature=0.0))))
    assert head_inputs == [(1, 1, model.args.dim)] * 3
    assert model.defer_head is False
    with torch.no_grad():
        full = model(torch.tensor([prompt + ids[:1]]))[0]
    assert (logits_seen[0] - full[-2]).abs().max().item() < CACHE_ATOL
    assert (logits_seen[1] - full[-1]).abs().max().item() < CACHE_ATOL


def test_top_k_sampling_is_seeded_and_stays_in_the_top_k():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))
    top5 = set(torch.topk(logits, 5).indices.tolist())

    def draws(**kwargs) -> list[int]:
        sampler = TokenSampler(Sampling(**kwargs))
        return [sampler(logits) for _ in range(300)]

    first = draws(temperature=1.0, top_k=5, seed=7)
    assert set(first) <= top5 and len(set(first)) > 1
    assert draws(temperature=1.0, top_k=5, seed=7) == first
    assert draws(temperature=1.0, top_k=5, seed=8) != first
    assert len(set(draws(temperature=5.0, top_k=0, seed=7)) - top5) > 10  # whole vocabulary
    assert set(draws(temperature=0.0, top_k=5)) == {int(logits.argmax())}

    model = small_model()
    runs = [
        list(generate_tokens(model, [1, 2], 10, TokenSampler(Sampling(0.9, 20, seed))))
        for seed in (3, 3, 4)
    ]
    assert runs[0] == runs[1] != runs[2]


def test_ids_past_the_tokenizer_are_never_sampled():
    """A model with more outputs (5,000) than the bundled tokenizer has tokens (4,096), its
    extra ids made the likeliest: greedy and top-k pick among the tokenizer's ids only, and
    the text decodes (an id the tokenizer lacks would raise KeyError)."""
    tokenizer = Tokenizer(ROOT / "torchtitan" / "assets" / "tokenizer.model")
    known = tokenizer.vocab_size
    model = small_model(vocab_size=5000)
    with torch.no_grad():
        model.output.weight[known:] *= 100.0
    prompt = tokenizer.encode(PROMPT, bos=True)
    assert next(generate_tokens(model, prompt, 1, greedy())) >= known  # what the limit stops
    for sampling in (Sampling(temperature=0.0), Sampling(temperature=2.0, top_k=50, seed=1)):
        options = generate.GenerateOptions(PROMPT, max_new_tokens=20, sampling=sampling)
        job = generate.GenerationJob(
            options, None, model.args, tokenizer, [PROMPT], [prompt], torch.device("cpu")
        )
        out = io.StringIO()
        ids = generate.stream(job, model, out)
        assert len(ids) == 20 and max(ids) < known, ids
        assert out.getvalue() == PROMPT + tokenizer.decode(ids) + "\n"
    logits = torch.zeros(5000)
    logits[known:] = 10.0
    sampler = TokenSampler(Sampling(temperature=1.0, top_k=0), vocab_size=known)
    picks = {sampler(logits) for _ in range(50)}
    assert max(picks) < known and len(picks) > 10


def test_top_p_keeps_the_smallest_likeliest_set_holding_p():
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3], [0.25, 0.25, 0.25, 0.25]])
    kept = nucleus(probs, 0.7)
    assert torch.equal(kept[0], probs[0] * torch.tensor([0, 1, 0, 1]))  # 0.5 + 0.3 >= 0.7
    assert (kept[1] > 0).sum() == 3  # ties: three quarters hold 0.7
    assert torch.equal(nucleus(probs, 0.85)[0], probs[0] * torch.tensor([0, 1, 1, 1]))
    assert (nucleus(probs, 0.01) > 0).sum(dim=-1).tolist() == [1, 1]  # the likeliest stays
    logits = probs[:1].log().repeat(2, 1)
    sampler = TokenSampler(Sampling(temperature=1.0, top_k=0, top_p=0.7), sequences=2)
    draws = [sampler.sample(logits) for _ in range(300)]
    assert {d for pair in draws for d in pair} == {1, 3}
    assert [d[0] for d in draws] != [d[1] for d in draws]  # each sequence its own generator


def test_sampling_options_are_checked():
    with pytest.raises(ValueError, match="--temperature must be >= 0"):
        TokenSampler(Sampling(temperature=-1.0))
    with pytest.raises(ValueError, match="--top_k must be >= 0"):
        TokenSampler(Sampling(top_k=-2))
    for top_p in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"--top_p must be in \(0, 1\]"):
            TokenSampler(Sampling(top_p=top_p))


def test_text_stream_holds_back_split_characters():
    tok = Tokenizer(ROOT / "torchtitan" / "assets" / "tokenizer.model")
    text = "naïve café — 日本語 🙂🚀 done"
    ids = tok.encode(text)
    pieces_bytes = [tok.encoding.decode_single_token_bytes(i) for i in ids]
    assert any(_invalid_utf8(b) for b in pieces_bytes)  # some character spans several tokens
    stream = generate.TextStream(tok)
    pieces = [stream.push(i) for i in ids] + [stream.finish()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def _invalid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


# ------------------------------------------------------------- checkpoints and transformers


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random debugmodel as a DCP seed checkpoint (run folder ``ckpt``) and its fp32 HF export
    (with the bundled tokenizer)."""
    root = tmp_path_factory.mktemp("gen")
    model = random_model(get_model_args("debugmodel"))
    save_seed_checkpoint(model, root / "ckpt" / "step-0")
    argv = ["--checkpoint", str(root / "ckpt"), "--out", str(root / "hf"), "--dtype", "float32"]
    assert script_main("convert_to_hf")(argv) == 0
    return root


def generate_ids(*argv: str) -> tuple[list[int], str, generate.GenerationJob]:
    options, rest = generate.split_flags(list(argv))
    job = generate.prepare(options, rest)
    out = io.StringIO()
    (ids,) = generate.run(job, out)
    return ids, out.getvalue(), job


def test_greedy_generation_matches_transformers(exported, capsys):
    transformers = needs_transformers()
    flags = ("--prompt", PROMPT, "--temperature", "0", "--max_new_tokens", str(NEW_TOKENS))
    ids, text, job = generate_ids(*flags, f"--checkpoint.initial_load_path={exported / 'ckpt'}")
    assert len(set(ids)) > 2
    assert (
        text == PROMPT + job.tokenizer.decode([i for i in ids if i != job.tokenizer.eos_id]) + "\n"
    )
    assert job.source.path == exported / "ckpt" / "step-0"  # the run folder's latest step

    hf_ids, _, hf_job = generate_ids(*flags, f"--checkpoint.initial_load_path={exported / 'hf'}")
    assert hf_job.source.in_hf and "Hugging Face folder" in hf_job.source.note
    assert hf_ids == ids

    hf = transformers.LlamaForCausalLM.from_pretrained(
        str(exported / "hf"), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    prompt = torch.tensor(job.prompt_ids)
    with torch.no_grad():
        out = hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            pad_token_id=job.tokenizer.eos_id,
        )
    assert out[0, prompt.shape[1] :].tolist() == ids


class Recorder(io.StringIO):
    """stdout that remembers what was written between flushes."""

    def __init__(self):
        super().__init__()
        self.flushed: list[str] = []
        self._mark = 0

    def flush(self):
        self.flushed.append(self.getvalue()[self._mark :])
        self._mark = len(self.getvalue())


def test_cli_streams_the_continuation(exported, capsys):
    out = Recorder()
    argv = ["--prompt", "def ", "--max_new_tokens", "12", "--top_k", "20", "--seed", "1"]
    argv.append(f"--checkpoint.initial_load_path={exported / 'ckpt' / 'step-0'}")
    assert generate.main(argv, out=out) == 0
    assert out.flushed[0] == "def "  # the prompt first, then one write per token
    assert len([piece for piece in out.flushed if piece]) >= 10
    assert "".join(out.flushed) == out.getvalue() and out.getvalue().endswith("\n")
    err = capsys.readouterr().err
    assert "loading DCP checkpoint" in err
    assert re.search(r"12 tokens in [\d.]+s: the first after \d+ ms, then [\d.]+ tokens/s", err)
    again = Recorder()
    assert generate.main(argv + ["--eager"], out=again) == 0  # eager is how CPU decodes anyway
    assert again.getvalue() == out.getvalue()  # same seed, same text


def test_module_entry_point(exported):
    r = subprocess.run(
        [sys.executable, "-m", "torchtitan.generate", "--prompt", "Hello", "--max_new_tokens=5"]
        + ["--job.dump_folder", str(exported), "--checkpoint.folder", "ckpt"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Hello") and len(r.stdout) > len("Hello\n")
    assert "note: latest complete checkpoint in" in r.stderr


def error_cases(root) -> list[tuple[list[str], str]]:
    ckpt = f"--checkpoint.initial_load_path={root / 'ckpt'}"
    return [
        (["--checkpoint.initial_load_path", str(root / "nowhere")], "checkpoint path "),
        (["--job.dump_folder", str(root / "empty_run")], "no checkpoint to generate from: "),
        ([f"--checkpoint.initial_load_path={root}"], f"{root} is a run folder, not a checkpoint; "),
        ([ckpt, "--model.flavor", "1B"], "checkpoint "),  # see the flavor assertion below
        ([ckpt, "--training.seq_len", "8", "--prompt", "a b c d e f g"], "the prompt ("),
        ([ckpt, "--top_k", "x"], "--top_k expects int, got 'x'"),
        ([ckpt, "--temperature", "-1"], "--temperature must be >= 0"),
        ([ckpt, "--top_p", "0"], "--top_p must be in (0, 1]"),
        ([ckpt, "--max_new_tokens", "0"], "--max_new_tokens must be >= 1"),
        ([ckpt, "--prompt"], "--prompt needs a value"),
        ([ckpt, "--promt", "hi"], "unknown option --promt; did you mean --prompt?"),
        ([ckpt, "--training.stepz", "3"], "unknown config key 'training.stepz'"),
        ([ckpt, "--device", "tpu"], "--device must be auto, cpu, cuda or cuda:N"),
        ([ckpt, "--model.tokenizer_path", str(root / "no.model")], "tokenizer file not found"),
    ]


def test_cli_errors_are_one_line(exported, capsys):
    for argv, start in error_cases(exported):
        assert generate.main(argv, out=io.StringIO()) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"error: {start}") and err.count("\n") == 1, (argv, err)
        if "1B" in argv:
            assert "does not match --model.flavor 1B: vocab_size 4096 vs 128256, dim 256 vs " in err
            assert err.endswith("(checkpoint vs model); --model.flavor debugmodel fits it\n")
        if "--training.seq_len" in argv:
            assert "exceeds the model's context of 8 tokens (--training.seq_len)" in err


def test_a_shape_override_mismatch_names_what_differs(exported, capsys):
    """A user already on debugmodel is not told that debugmodel fits: the override differs."""
    ckpt = f"--checkpoint.initial_load_path={exported / 'ckpt'}"
    assert generate.main([ckpt, "--model.n_layers", "4"], out=io.StringIO()) == 2
    assert capsys.readouterr().err == (
        f"error: checkpoint {exported / 'ckpt' / 'step-0'} does not match --model.flavor "
        "debugmodel with --model.n_layers 4: n_layers 6 vs 4 (checkpoint vs model); drop "
        "--model.n_layers: flavor debugmodel as it is fits it\n"
    )
    argv = [ckpt, "--model.flavor", "1B", "--model.dim", "256", "--model.vocab_size", "4096"]
    assert generate.main(argv, out=io.StringIO()) == 2
    assert capsys.readouterr().err.endswith(
        "--model.flavor debugmodel fits it (without --model.vocab_size, --model.dim)\n"
    )


def test_unreadable_checkpoint_is_one_line(exported, tmp_path, capsys):
    import shutil

    broken = tmp_path / "step-0"
    shutil.copytree(exported / "ckpt" / "step-0", broken)
    for data in broken.glob("*.distcp"):
        data.write_bytes(data.read_bytes()[:100])
    argv = [f"--checkpoint.initial_load_path={broken}", "--max_new_tokens", "2"]
    assert generate.main(argv, out=io.StringIO()) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"error: could not load {broken}: ")


def test_bfloat16_load_keeps_a_float32_rope_cache(exported):
    """The GPU path's dtype handling, on CPU: parameters and KV cache in bf16, RoPE in fp32."""
    from torchtitan.inference.weights import load_model, locate_weights

    source = locate_weights(exported / "ckpt")
    args = get_model_args("debugmodel", max_seq_len=64)
    full = load_model(source, args, torch.device("cpu"), torch.float32)
    half = load_model(source, args, torch.device("cpu"), torch.bfloat16)
    assert half.rope_cache.dtype == torch.float32
    assert torch.equal(half.rope_cache, full.rope_cache)
    for (name, p), q in zip(half.named_parameters(), full.parameters()):
        assert p.dtype == torch.bfloat16 and torch.equal(p, q.bfloat16()), name
    assert len(list(generate_tokens(half, [3840, 10, 11], 5, greedy()))) == 5
