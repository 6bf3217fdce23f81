"""Batched generation: sequences at different positions in one decoding step, prompts of
different lengths right-padded in one pass, samples sharing their prompt's pass, per-sequence
seeds, ``--prompts_file``, ``--num_samples``, ``--batch_size`` and ``--output``.

The reference for every batched result is the same sequence decoded alone (fp32, CPU): a
padded position read by a query, a position off by one or a row's RoPE angle taken from another
sequence moves the logits by their own size, far past CACHE_ATOL.
"""

from __future__ import annotations

import io
import json

import pytest
import torch

from tests.unit.test_generate import CACHE_ATOL, exported, greedy, small_model  # noqa: F401
from torchtitan import generate
from torchtitan.config import ConfigError
from torchtitan.inference import generation
from torchtitan.inference.generation import generate_batch, generate_tokens
from torchtitan.inference.graphed_decode import decode_step
from torchtitan.inference.prompts import read_prompts
from torchtitan.inference.sampling import Sampling, TokenSampler, sequence_seed
from torchtitan.models.llama3.kv_cache import KVCache

PROMPTS = [[1, 7, 9, 4, 2, 8], [1, 5], [1, 7, 9, 4, 2, 8], [1, 3, 3, 6]]  # lengths 6, 2, 6, 4


@pytest.mark.parametrize("n_kv_heads", [2, None], ids=["gqa", "mha"])
def test_one_step_decodes_sequences_at_different_positions(n_kv_heads):
    """Three sequences at positions 20, 9 and 14 in one ``decode_step``: each gets the logits,
    keys and values of its own cached forward."""
    model = small_model(n_kv_heads=n_kv_heads)
    x = torch.randint(0, model.args.vocab_size, (3, 24), generator=torch.Generator().manual_seed(1))
    lengths = [20, 9, 14]
    alone = [KVCache(model.args, batch_size=1, max_len=32) for _ in lengths]
    batch = KVCache(model.args, batch_size=3, max_len=32)
    with torch.no_grad():
        for row, (cache, n) in enumerate(zip(alone, lengths)):
            model(x[row : row + 1, :n], cache=cache, start_pos=0)
            for name, layer in batch.layers.items():
                layer.keys[row] = cache.layers[name].keys[0]
                layer.values[row] = cache.layers[name].values[0]
        tokens = torch.stack([x[row, n] for row, n in enumerate(lengths)])[:, None]
        got = decode_step(model, batch, tokens, torch.tensor(lengths), torch.arange(32))
        for row, (cache, n) in enumerate(zip(alone, lengths)):
            want = model(x[row : row + 1, n : n + 1], cache=cache, start_pos=n)[0, -1]
            assert want.abs().max() > 1.0
            assert (got[row] - want).abs().max().item() < CACHE_ATOL, row
            for name, layer in batch.layers.items():
                torch.testing.assert_close(layer.keys[row], cache.layers[name].keys[0])
                torch.testing.assert_close(layer.values[row], cache.layers[name].values[0])


@pytest.mark.parametrize(
    "prompts",
    [PROMPTS, [[1, 7, 9, 4, 2, 8], [1, 3, 3, 6, 5, 5]]],
    ids=["different_positions", "one_position"],
)
def test_a_batch_decodes_each_prompt_as_it_would_alone(prompts):
    """Greedy: the same tokens as each prompt decoded alone, for prompts of lengths 6, 2, 6 and
    4 (one repeated; ``decode_step``'s path) and for two of one length (the model's forward)."""
    model = small_model()
    alone = [list(generate_tokens(model, p, 12, greedy())) for p in prompts]
    sampler = TokenSampler(Sampling(0.0), sequences=len(prompts))
    steps = list(generate_batch(model, prompts, 12, sampler))
    assert [list(seq) for seq in zip(*steps)] == alone
    assert len({tuple(a) for a in alone}) == len({tuple(p) for p in prompts})


def test_the_prompts_pass_goes_in_groups_of_bounded_tokens(monkeypatch):
    """With 8 padded tokens per forward, prompts of 6, 2, 6 (the first again) and 4 tokens go
    through as [6] and [2, 4] (the repeat shares the first's pass), and decode as alone."""
    monkeypatch.setattr(generation, "PROMPT_PASS_TOKENS", 8)
    model = small_model()
    alone = [list(generate_tokens(model, p, 6, greedy())) for p in PROMPTS]
    calls = []
    model.register_forward_hook(lambda m, args, out: calls.append(tuple(args[0].shape)))
    steps = list(generate_batch(model, PROMPTS, 6, TokenSampler(Sampling(0.0), sequences=4)))
    assert calls[:2] == [(1, 6), (2, 4)] and all(c[1] == 1 for c in calls[2:])
    assert [list(seq) for seq in zip(*steps)] == alone


def test_samples_share_their_prompt_pass_and_keep_their_seeds():
    """Sequence i of a batch samples as the same prompt alone with ``sequence_seed(seed, i)``:
    the samples of one prompt differ, and the batch does not change any of them."""
    model = small_model()
    sampling = Sampling(temperature=1.0, top_k=20, seed=5)
    prompts = [PROMPTS[0]] * 3 + [PROMPTS[1]]
    calls = []
    model.register_forward_hook(lambda m, args, out: calls.append(args[0].shape))
    steps = list(generate_batch(model, prompts, 10, TokenSampler(sampling, sequences=4)))
    assert calls == [(2, 6)]  # one pass over the two distinct prompts, right-padded
    batched = [list(seq) for seq in zip(*steps)]
    for i, prompt in enumerate(prompts):
        single = Sampling(temperature=1.0, top_k=20, seed=sequence_seed(5, i))
        assert list(generate_tokens(model, prompt, 10, TokenSampler(single))) == batched[i], i
    assert len({tuple(seq) for seq in batched[:3]}) == 3


def test_a_batch_stops_when_every_sequence_has_ended():
    model = small_model()
    free = list(generate_tokens(model, PROMPTS[1], 12, greedy()))
    eos = next(t for i, t in enumerate(free[2:], 2) if t not in free[:i])
    steps = list(
        generate_batch(model, [PROMPTS[1]] * 2, 12, TokenSampler(Sampling(0.0), sequences=2), eos)
    )
    assert len(steps) == free.index(eos) + 1 and steps[-1] == [eos, eos]
    other = list(generate_tokens(model, PROMPTS[3], 12, greedy(), eos_id=eos))
    mixed = list(
        generate_batch(
            model, [PROMPTS[1], PROMPTS[3]], 12, TokenSampler(Sampling(0.0), sequences=2), eos
        )
    )
    assert len(mixed) == max(free.index(eos) + 1, len(other))


def test_sequence_seeds_do_not_repeat_across_nearby_seeds():
    """The first sequence keeps --seed (one prompt alone samples as before); the others get
    63-bit seeds that the runs of seeds 0-99 with 100 sequences each never share."""
    assert sequence_seed(7, 0) == 7
    seeds = [sequence_seed(s, i) for s in range(100) for i in range(1, 100)]
    assert len(set(seeds)) == len(seeds) and not set(seeds) & set(range(100))
    assert all(0 <= x < 2**63 for x in seeds)


def test_a_sampler_refuses_logits_of_another_batch():
    with pytest.raises(ValueError, match="logits of 3 sequences for a sampler of 2"):
        TokenSampler(Sampling(), sequences=2).sample(torch.zeros(3, 10))


# --------------------------------------------------------------------------- prompts file


def test_prompt_files_text_and_json_lines(tmp_path):
    text = tmp_path / "prompts.txt"
    text.write_bytes("first prompt\r\n\n  \ndef f(x): \nform\ffeed\u2028sep\nlast".encode())
    assert read_prompts(str(text)) == ["first prompt", "def f(x): ", "form\ffeed\u2028sep", "last"]
    lines = tmp_path / "prompts.jsonl"
    record = '{"prompt": "two\\nlines", "id": 3}\n\n{"prompt": "café\u2028"}\n'
    lines.write_text(record, encoding="utf-8")
    assert read_prompts(str(lines)) == ["two\nlines", "café\u2028"]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("none.txt", None, "no such file"),
        ("blank.txt", "\n \n", "holds no prompts"),
        ("bad.jsonl", '{"prompt": "a"}\n{"prompt": \n', "line 2: not JSON"),
        ("key.jsonl", '{"text": "a"}\n', 'line 1: expected an object with a "prompt" string'),
        ("latin1.txt", b"caf\xe9\n", "is not UTF-8 text"),
    ],
)
def test_prompt_file_mistakes_are_one_line(tmp_path, name, content, message):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message) as e:
        read_prompts(str(path))
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------ the CLI


def test_cli_batches_samples_and_writes_json_lines(exported, tmp_path, capsys):  # noqa: F811
    """3 prompts x 2 samples in batches of 4 (two batches): each sequence printed under its
    header and written as a JSON line, with the tokens a single run with its seed gives."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("The tokenizer\ndef \nOnce upon a time\n")
    output = tmp_path / "out.jsonl"
    ckpt = f"--checkpoint.initial_load_path={exported / 'ckpt' / 'step-0'}"
    argv = ["--prompts_file", str(prompts), "--num_samples", "2", "--batch_size", "4"]
    argv += ["--max_new_tokens", "8", "--seed", "11", "--output", str(output), ckpt]
    out = io.StringIO()
    assert generate.main(argv, out=out) == 0
    err = capsys.readouterr().err
    assert "6 sequences in 2 batches of up to 4: " in err
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(r["prompt_index"], r["sample"], r["seed"]) for r in records] == [
        (p, s, sequence_seed(11, 2 * p + s)) for p in range(3) for s in range(2)
    ]
    text = out.getvalue()
    for r in records:
        assert len(r["token_ids"]) == 8 and r["stopped_at"] == "max_new_tokens"
        header = f"--- prompt {r['prompt_index'] + 1} of 3, sample {r['sample'] + 1} of 2: 8 tokens"
        assert (
            f"{header}, stopped at --max_new_tokens ---\n{r['prompt']}{r['completion']}\n" in text
        )
    assert records[0]["token_ids"] != records[1]["token_ids"]  # two samples of one prompt
    single = io.StringIO()
    again = ["--prompt", "def ", "--max_new_tokens", "8", "--seed", str(records[3]["seed"]), ckpt]
    assert generate.main(again, out=single) == 0
    assert single.getvalue() == records[3]["prompt"] + records[3]["completion"] + "\n"
    capsys.readouterr()
    assert generate.main(argv, out=io.StringIO()) == 2  # the output exists now: not overwritten
    assert capsys.readouterr().err.startswith(f"error: --output {output} exists; name a new file")
    assert len(output.read_text().splitlines()) == 6


def test_cli_batch_mistakes_are_one_line(exported, tmp_path, capsys):  # noqa: F811
    ckpt = f"--checkpoint.initial_load_path={exported / 'ckpt'}"
    prompts = tmp_path / "p.txt"
    prompts.write_text("short\n" + "a b c d e f g h i j\n")
    cases = [
        (["--num_samples", "0"], "--num_samples must be >= 1; got 0"),
        (["--batch_size", "-2"], "--batch_size must be >= 1; got -2"),
        (["--prompt", "x", "--prompts_file", str(prompts)], "--prompt and --prompts_file exclude"),
        (["--prompts_file", str(tmp_path / "no.txt")], f"--prompts_file {tmp_path / 'no.txt'}: no"),
        (["--output", str(tmp_path / "no" / "o.jsonl")], "--output "),
        (
            ["--prompts_file", str(prompts), "--training.seq_len", "12", "--max_new_tokens", "4"],
            "prompt 2 of --prompts_file (",
        ),
    ]
    for argv, start in cases:
        assert generate.main([ckpt, *argv], out=io.StringIO()) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"error: {start}") and err.count("\n") == 1, (argv, err)


def test_a_batch_that_cannot_fit_the_gpu_is_refused_before_loading(monkeypatch):
    """8B in bf16 (16 GB), a cache of 64 sequences x 8,192 positions (64 GiB) and the prompts'
    pass against 40 GiB free: one line naming the sizes and what to lower; batch 4 (4 GiB)
    fits."""
    from torchtitan.models.llama3 import get_model_args

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (40 * 2**30, 80 * 2**30))
    options = generate.GenerateOptions(num_samples=64, batch_size=64, max_new_tokens=8000)
    job = generate.GenerationJob(
        options, None, get_model_args("8B"), None, ["x"], [[1] * 192], torch.device("cuda")
    )
    with pytest.raises(ConfigError) as e:
        generate.check_memory(job)
    assert str(e.value) == (
        "8.0B bf16 weights (15.0 GiB), a KV cache of 64 sequences x 8192 positions (64.0 GiB) "
        "and the prompts' pass (3.8 GiB) do not fit the 40.0 GiB free on cuda; lower "
        "--batch_size or --max_new_tokens"
    )
    options.batch_size = 4
    generate.check_memory(job)


@pytest.mark.parametrize(
    "raised, status, start",
    [
        (torch.OutOfMemoryError("CUDA out of memory"), 1, "error: out of GPU memory while"),
        (FileExistsError("out.jsonl"), 2, "error: --output out.jsonl appeared while the model"),
    ],
)
def test_running_out_of_memory_or_a_new_output_file_is_one_line(
    exported,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
    raised,
    status,
    start,
):
    def failing_run(job, out):
        raise raised

    monkeypatch.setattr(generate, "run", failing_run)
    ckpt = exported / "ckpt" / "step-0"  # the step itself: no note line before the error
    argv = [f"--checkpoint.initial_load_path={ckpt}", "--output", "out.jsonl"]
    monkeypatch.chdir(tmp_path)
    assert generate.main(argv, out=io.StringIO()) == status
    err = capsys.readouterr().err
    assert err.startswith(start) and err.count("\n") == 1, err
