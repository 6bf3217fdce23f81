"""Generation on a GPU (docs/generation.md): the bf16 KV-cache path, whose attention kernels differ
from the CPU's (a causal prompt pass, then one query over the cache, then an offset chunk with an
explicit mask), gives the logits of one full bf16 forward; the replayed CUDA graph gives the eager
step's, for one sequence and for three at different positions; and ``python -m
torchtitan.generate`` loads a DCP checkpoint onto the GPU in bf16 and streams a continuation,
with and without the graph, and decodes a prompts file in batches."""

from __future__ import annotations

import io
import json

import pytest
import torch

from tests.unit.test_hf import random_model
from torchtitan import generate
from torchtitan.checkpoint import save_seed_checkpoint
from torchtitan.inference.graphed_decode import GraphedDecoder
from torchtitan.inference.weights import empty_model
from torchtitan.models.llama3 import get_model_args
from torchtitan.models.llama3.kv_cache import KVCache

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def gpu_model(args):
    model = empty_model(args, CUDA, torch.bfloat16)  # as torchtitan.generate loads it
    model.load_state_dict(random_model(args).state_dict())
    return model


def test_cached_decoding_matches_a_full_forward_on_gpu():
    args = get_model_args("debugmodel", max_seq_len=64)
    cpu = random_model(args)
    model = gpu_model(args)
    x = torch.randint(0, args.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    cache = KVCache(args, batch_size=2, max_len=64, device=CUDA, dtype=torch.bfloat16)
    with torch.no_grad():
        want = cpu(x)  # float32 on CPU
        full = model(x.to(CUDA))
        pieces = [model(x[:, :40].to(CUDA), cache=cache, start_pos=0)]
        pieces += [model(x[:, p : p + 1].to(CUDA), cache=cache, start_pos=p) for p in range(40, 48)]
        pieces.append(model(x[:, 48:].to(CUDA), cache=cache, start_pos=48))
    cached = torch.cat(pieces, dim=1).cpu()
    full = full.cpu()
    bf16_vs_fp32 = relative_error(full, want)
    cached_vs_full = relative_error(cached, full)
    agree = (cached.argmax(-1) == full.argmax(-1)).float().mean().item()
    print(
        f"relative to the largest logit: bf16 vs fp32 {bf16_vs_fp32:.4f}, cached vs full "
        f"{cached_vs_full:.4f}; the same argmax at {agree:.1%} of the positions"
    )
    # A cache bug (a position off, a missing mask) or a weight loaded wrongly moves the logits
    # by their own size. bf16 rounding through 6 blocks whose outputs random_model scales up
    # tenfold: 3.0 % of the largest logit against fp32 and < 0.005 % cached against full on an
    # H200.
    assert bf16_vs_fp32 < 0.1
    assert cached_vs_full < 0.05
    assert agree > 0.9


@pytest.mark.parametrize("lengths", [[16], [16, 9, 12]], ids=["one", "three"])
def test_the_cuda_graph_gives_the_eager_steps_logits(lengths):
    """Teacher-forced: the same tokens through each sequence's eager cached forward and through
    the replayed graph over all of them at once (their own cache; the sequences at different
    positions), step by step after the prompts' pass."""
    args = get_model_args("debugmodel", max_seq_len=64)
    model = gpu_model(args)
    batch = len(lengths)
    x = torch.randint(0, args.vocab_size, (batch, 48), generator=torch.Generator().manual_seed(0))
    x = x.to(CUDA)
    alone = [KVCache(args, 1, 48, device=CUDA, dtype=torch.bfloat16) for _ in lengths]
    graph_cache = KVCache(args, batch, 48, device=CUDA, dtype=torch.bfloat16)
    errors, agree = [], []
    with torch.inference_mode():
        for row, (cache, n) in enumerate(zip(alone, lengths)):
            model(x[row : row + 1, :n], cache=cache, start_pos=0)
            for name, layer in graph_cache.layers.items():
                layer.keys[row, :, :n] = cache.layers[name].keys[0, :, :n]
                layer.values[row, :, :n] = cache.layers[name].values[0, :, :n]
        graphed = GraphedDecoder(model, graph_cache)
        for step in range(31):
            positions = [n + step for n in lengths]
            tokens = [int(x[row, p]) for row, p in enumerate(positions)]
            got = graphed(tokens, positions).clone()
            for row, (cache, p) in enumerate(zip(alone, positions)):
                want = model(x[row : row + 1, p : p + 1], cache=cache, start_pos=p)[0, -1]
                errors.append(relative_error(got[row].cpu(), want.cpu()))
                agree.append(bool(got[row].argmax() == want.argmax()))
    same = agree.count(True)
    print(
        f"graph vs eager, {batch} sequences: largest relative error {max(errors):.4f}, "
        f"same argmax {same}/{len(agree)}"
    )
    # Both sum in float32 and round the probabilities to bf16, in different orders (1.94 % on an
    # H200); a wrong position or mask is off by the logits' own size.
    assert max(errors) < 0.05
    assert same >= 0.9 * len(agree)


def test_the_command_line_generates_on_gpu(tmp_path, capsys):
    args = get_model_args("debugmodel")
    save_seed_checkpoint(random_model(args), tmp_path / "step-0")
    argv = ["--prompt", "The tokenizer", "--max_new_tokens", "32", "--temperature", "0"]
    argv += ["--device", "cuda", f"--checkpoint.initial_load_path={tmp_path / 'step-0'}"]
    for extra in ([], ["--eager"]):
        out = io.StringIO()
        assert generate.main(argv + extra, out=out) == 0
        err = capsys.readouterr().err
        print(out.getvalue(), err)
        assert out.getvalue().startswith("The tokenizer") and len(out.getvalue()) > 20
        assert "on cuda (bfloat16)" in err and "32 tokens in" in err


def test_the_command_line_decodes_batches_on_gpu(tmp_path, capsys):
    """5 prompts x 2 samples in batches of 4 (the last of 2), graphed and eager: every sequence
    printed and written, 32 tokens each (the random model rarely samples EOS; 2 are allowed)."""
    args = get_model_args("debugmodel")
    save_seed_checkpoint(random_model(args), tmp_path / "step-0")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The tokenizer\nA\nOnce upon a time there was\ndef f(x):\nIn 1990,\n")
    for extra in ([], ["--eager"]):
        output = tmp_path / f"out{len(extra)}.jsonl"
        argv = ["--prompts_file", str(prompts), "--num_samples", "2", "--batch_size", "4"]
        argv += ["--max_new_tokens", "32", "--device", "cuda", "--output", str(output)]
        argv += [f"--checkpoint.initial_load_path={tmp_path / 'step-0'}", *extra]
        out = io.StringIO()
        assert generate.main(argv, out=out) == 0
        err = capsys.readouterr().err
        print(err)
        assert "10 sequences in 3 batches of up to 4: " in err
        assert out.getvalue().count("--- prompt ") == 10
        lengths = [len(json.loads(line)["token_ids"]) for line in output.read_text().splitlines()]
        assert len(lengths) == 10 and lengths.count(32) >= 8
