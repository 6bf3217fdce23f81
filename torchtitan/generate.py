"""Generate text from a checkpoint: ``python -m torchtitan.generate``.

    python -m torchtitan.generate --job.config_file train_configs/debug_model.toml \\
        --prompt "The tokenizer" --max_new_tokens 50

Takes the trainer's config (``--job.config_file`` and ``--section.key value`` overrides) plus the
flags below. The weights come from ``--checkpoint.initial_load_path`` (a DCP ``step-N`` folder, a
run's checkpoint folder, whose latest complete step is used, or a Hugging Face folder), by default
the config's own checkpoint folder. Runs on CPU (float32) or one GPU (bfloat16) with a KV cache.
One sequence is streamed: the prompt, then each piece of text as it is decoded. Several (a
``--prompts_file``, ``--num_samples``) are decoded in batches and printed as each batch ends;
``--output`` also writes them as JSON lines. See docs/generation.md.
"""

from __future__ import annotations

import codecs
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import torch

from torchtitan.checkpoint import CheckpointError
from torchtitan.config import ConfigError, JobConfig, parse_args
from torchtitan.config.parse import take_flags
from torchtitan.data.tokenizer import JsonTokenizer, Tokenizer, load_tokenizer
from torchtitan.inference.batch_output import (
    ResultsFile,
    batches_summary,
    completed_text,
    header,
    stop_reason,
    until_eos,
)
from torchtitan.inference.generation import PROMPT_PASS_TOKENS, generate_batch, generate_tokens
from torchtitan.inference.prompts import read_prompts
from torchtitan.inference.sampling import Sampling, TokenSampler
from torchtitan.inference.weights import WeightsSource, load_model, locate_weights, model_args_for
from torchtitan.models.llama3 import ModelArgs, Transformer

FLAGS = {  # name: (type, help); the defaults are GenerateOptions'
    "prompt": (str, "text to continue (BOS is prepended); empty: start from BOS alone"),
    "prompts_file": (
        str,
        'prompts, one per line (blank lines skipped), or .jsonl: {"prompt": ...}',
    ),
    "num_samples": (int, "continuations of each prompt, each from its own seed (see --output)"),
    "batch_size": (int, "sequences decoded together, at most"),
    "output": (str, "also write every continuation as a JSON line to this new file"),
    "max_new_tokens": (int, "stop after this many new tokens (or at the tokenizer's EOS)"),
    "temperature": (float, "sampling temperature; 0 = greedy (always the most likely token)"),
    "top_k": (int, "sample among the k most likely tokens; 0 = the whole vocabulary"),
    "top_p": (float, "then among the fewest likeliest tokens holding this share; 1 = no limit"),
    "seed": (int, "seed of the sampling generator: the same seed gives the same text"),
    "device": (str, "auto (cuda if available, else cpu), cpu, cuda or cuda:N"),
    "eager": (bool, "on a GPU, launch each token's kernels from Python, not as a CUDA graph"),
}
SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "seed")  # fields of Sampling


@dataclass
class GenerateOptions:
    prompt: str = ""
    prompts_file: str = ""
    num_samples: int = 1
    batch_size: int = 16
    output: str = ""
    max_new_tokens: int = 100
    sampling: Sampling = field(default_factory=Sampling)
    device: str = "auto"
    eager: bool = False

    def owner(self, name: str):
        """The object holding flag ``name``."""
        return self.sampling if name in SAMPLING_FLAGS else self


def usage() -> str:
    defaults = GenerateOptions()
    lines = [
        "usage: python -m torchtitan.generate [--prompt TEXT] [generation flags] "
        "[--section.key VALUE ...]",
        "",
        "generation flags:",
    ]
    for name, (_, text) in FLAGS.items():
        default = getattr(defaults.owner(name), name)
        lines.append(f"  --{name} ({default!r})\n      {text}")
    lines += [
        "",
        "Every trainer option is accepted too (python -m torchtitan.train --help): the model is",
        "--model.flavor with --training.seq_len positions, the tokenizer --model.tokenizer_path,",
        "the weights --checkpoint.initial_load_path (default: job.dump_folder/checkpoint.folder).",
    ]
    return "\n".join(lines)


def split_flags(argv: list[str]) -> tuple[GenerateOptions, list[str]]:
    """Take the generation flags out of argv (``take_flags``); the rest is the trainer's config."""
    values, rest = take_flags(argv, {name: kind for name, (kind, _) in FLAGS.items()})
    if "prompt" in values and "prompts_file" in values:
        raise ConfigError("--prompt and --prompts_file exclude each other; pass one")
    options = GenerateOptions()
    for name, value in values.items():
        setattr(options.owner(name), name, value)
    return options, rest


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N; got {name!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N; got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA GPU is available; use --device cpu")
    return device


def weights_path(cfg: JobConfig) -> Path:
    c = cfg.checkpoint
    if c.initial_load_path:
        return Path(c.initial_load_path)
    if c.initial_load_in_hf:
        raise ConfigError("--checkpoint.initial_load_in_hf needs --checkpoint.initial_load_path")
    default = Path(cfg.job.dump_folder) / c.folder
    if not default.exists():
        raise ConfigError(
            f"no checkpoint to generate from: {default} does not exist; pass "
            "--checkpoint.initial_load_path (a step-N folder, a checkpoint folder or an HF folder)"
        )
    return default


@dataclass
class GenerationJob:
    options: GenerateOptions
    source: WeightsSource
    args: ModelArgs
    tokenizer: Tokenizer | JsonTokenizer
    prompts: list[str]
    prompt_ids: list[list[int]]  # each with BOS
    device: torch.device

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.device.type == "cuda" else torch.float32

    @property
    def sequences(self) -> int:
        return len(self.prompts) * self.options.num_samples


def check_options(options: GenerateOptions) -> None:
    options.sampling.validate()
    for name in ("max_new_tokens", "num_samples", "batch_size"):
        if getattr(options, name) < 1:
            raise ConfigError(f"--{name} must be >= 1; got {getattr(options, name)}")
    if options.output:
        output = Path(options.output).expanduser()
        if output.exists():
            raise ConfigError(
                f"--output {options.output} exists; name a new file (nothing is overwritten)"
            )
        if not output.parent.is_dir():
            raise ConfigError(f"--output {options.output}: folder {output.parent} does not exist")


def check_fits(options: GenerateOptions, prompt_ids: list[list[int]], args: ModelArgs, hf: bool):
    longest = max(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    total = len(prompt_ids[longest]) + options.max_new_tokens
    if total > args.max_seq_len:
        limit = "max_position_embeddings in config.json" if hf else "--training.seq_len"
        which = f"prompt {longest + 1} of --prompts_file" if options.prompts_file else "the prompt"
        raise ConfigError(
            f"{which} ({len(prompt_ids[longest])} tokens with BOS) + --max_new_tokens "
            f"{options.max_new_tokens} = {total} exceeds the model's context of "
            f"{args.max_seq_len} tokens ({limit}); shorten the prompt or lower --max_new_tokens"
        )


def prepare(options: GenerateOptions, rest: list[str]) -> GenerationJob:
    """Everything that can be checked without reading tensors; a mistake is one ValueError."""
    check_options(options)
    cfg = parse_args(rest)
    if cfg.model.name != "llama3":
        raise ConfigError(
            f"generation runs Llama 3 models only; --model.name {cfg.model.name} trains but "
            "does not generate yet"
        )
    device = resolve_device(options.device)
    prompts = read_prompts(options.prompts_file) if options.prompts_file else [options.prompt]
    source = locate_weights(weights_path(cfg), cfg.checkpoint.initial_load_in_hf)
    args = model_args_for(source, cfg)
    tokenizer = load_tokenizer(cfg.model.tokenizer_path)
    if tokenizer.vocab_size > args.vocab_size:
        raise ConfigError(
            f"tokenizer {cfg.model.tokenizer_path} has {tokenizer.vocab_size} tokens but the "
            f"model's vocab_size is {args.vocab_size}; pass the --model.tokenizer_path it was "
            "trained with"
        )
    if tokenizer.vocab_size < args.vocab_size:
        log(
            f"warning: tokenizer {cfg.model.tokenizer_path} has {tokenizer.vocab_size} tokens, the "
            f"model {args.vocab_size}: is it the tokenizer the model was trained with? (ids from "
            f"{tokenizer.vocab_size} on are never generated)"
        )
    prompt_ids = [tokenizer.encode(prompt, bos=True) for prompt in prompts]
    check_fits(options, prompt_ids, args, source.in_hf)
    job = GenerationJob(options, source, args, tokenizer, prompts, prompt_ids, device)
    check_memory(job)
    return job


def check_memory(job: GenerationJob) -> None:
    """On a GPU: the weights, the largest batch's KV cache and the prompts' pass (one group of
    PROMPT_PASS_TOKENS: its staged keys and values and its feed-forward activations) must fit
    the free memory. An estimate; running out later is one line too (``main``)."""
    if job.device.type != "cuda":
        return
    a = job.args
    batch = min(job.options.batch_size, job.sequences)
    positions = max(map(len, job.prompt_ids)) + job.options.max_new_tokens
    per_position = 2 * a.n_layers * a.kv_heads * a.head_dim * 2  # K and V, bf16
    activations = (3 * a.ffn_hidden_dim + 4 * a.dim) * 2
    cache, weights = batch * positions * per_position, a.num_params() * 2
    prompts_pass = PROMPT_PASS_TOKENS * (per_position + activations)
    free, _ = torch.cuda.mem_get_info(job.device)
    if weights + cache + prompts_pass > free:
        raise ConfigError(
            f"{a.num_params() / 1e9:.1f}B bf16 weights ({weights / 2**30:.1f} GiB), a KV cache of "
            f"{batch} sequences x {positions} positions ({cache / 2**30:.1f} GiB) and the prompts' "
            f"pass ({prompts_pass / 2**30:.1f} GiB) do not fit the {free / 2**30:.1f} GiB free on "
            f"{job.device}; lower --batch_size or --max_new_tokens"
        )


class TextStream:
    """Token ids -> text, piece by piece: the bytes of a character split over several tokens
    are held back until it is complete, so the pieces join to ``tokenizer.decode(ids)``."""

    def __init__(self, tokenizer: Tokenizer | JsonTokenizer):
        self.tokenizer = tokenizer
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self.decoder.decode(self.tokenizer.token_bytes(token_id))

    def finish(self) -> str:
        return self.decoder.decode(b"", final=True)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load(job: GenerationJob) -> Transformer:
    kind = "Hugging Face folder" if job.source.in_hf else "DCP checkpoint"
    log(f"loading {kind} {job.source.path} on {job.device} ({str(job.dtype).split('.')[-1]})")
    start = time.perf_counter()
    model = load_model(job.source, job.args, job.device, job.dtype)
    log(f"loaded {job.args.num_params():,} parameters in {time.perf_counter() - start:.1f}s")
    return model


def stream(job: GenerationJob, model: Transformer, out: TextIO) -> list[int]:
    """Write the prompt, then each decoded piece of the continuation; -> the new token ids."""
    eos_id, options = job.tokenizer.eos_id, job.options
    text, ids, first = TextStream(job.tokenizer), [], 0.0
    out.write(job.prompts[0])
    out.flush()
    start = time.perf_counter()
    sampler = TokenSampler(options.sampling, vocab_size=job.tokenizer.vocab_size)
    tokens = generate_tokens(
        model, job.prompt_ids[0], options.max_new_tokens, sampler, eos_id, not options.eager
    )
    for token in tokens:
        ids.append(token)
        if len(ids) == 1:
            first = time.perf_counter() - start
        if token != eos_id:
            out.write(text.push(token))
            out.flush()
    out.write(text.finish() + "\n")
    out.flush()
    log(summary(ids, first, time.perf_counter() - start, eos_id))
    return ids


def summary(ids: list[int], first: float, seconds: float, eos_id: int | None) -> str:
    """``32 tokens in 0.41s: the first after 52 ms, then 78.0 tokens/s; stopped at EOS``."""
    line = f"{len(ids)} tokens in {seconds:.2f}s: the first after {first * 1e3:.0f} ms"
    if len(ids) > 1:
        line += f", then {(len(ids) - 1) / (seconds - first):.1f} tokens/s"
    return f"{line}; stopped at {stop_reason(ids, eos_id)}"


def decode_batches(
    job: GenerationJob, model: Transformer, out: TextIO, results: ResultsFile
) -> list[list[int]]:
    """Decode every (prompt, sample) sequence, ``--batch_size`` at a time, and print each
    with a header line as its batch ends; -> each sequence's new token ids."""
    options, eos_id = job.options, job.tokenizer.eos_id
    n, size = job.sequences, options.batch_size
    all_ids: list[list[int]] = []
    start = time.perf_counter()
    for first in range(0, n, size):
        batch = range(first, min(first + size, n))
        prompts = [job.prompt_ids[i // options.num_samples] for i in batch]
        sampler = TokenSampler(options.sampling, job.tokenizer.vocab_size, len(batch), first)
        steps = generate_batch(
            model, prompts, options.max_new_tokens, sampler, eos_id, not options.eager
        )
        for sequence, ids in zip(batch, until_eos(steps, len(batch), eos_id)):
            out.write(header(job, sequence, ids) + "\n" + completed_text(job, sequence, ids))
            out.flush()
            results.write(job, sequence, ids)
            all_ids.append(ids)
    log(batches_summary(job, all_ids, time.perf_counter() - start))
    return all_ids


def run(job: GenerationJob, out: TextIO) -> list[list[int]]:
    """Load the weights and generate: one sequence streamed to ``out``, several in batches;
    -> each sequence's new token ids."""
    model = load(job)
    results = ResultsFile(job.options.output)
    try:
        if job.sequences > 1:
            return decode_batches(job, model, out, results)
        ids = stream(job, model, out)
        results.write(job, 0, ids)
        return [ids]
    finally:
        results.close()


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """0: generated; 2: a mistake in the command line, config, checkpoint or prompt; 1: the
    checkpoint could not be read. Errors are one ``error: ...`` line on stderr."""
    try:
        options, rest = split_flags(sys.argv[1:] if argv is None else argv)
        if "-h" in rest or "--help" in rest:
            print(usage())
            return 0
        job = prepare(options, rest)
    except (ValueError, OSError) as e:  # ConfigError and TokenizerError are ValueErrors
        print(f"error: {e}", file=sys.stderr)
        return 2
    if job.source.note:
        log(f"note: {job.source.note}")
    try:
        run(job, out or sys.stdout)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except FileExistsError:
        print(
            f"error: --output {options.output} appeared while the model loaded; nothing was "
            "overwritten",
            file=sys.stderr,
        )
        return 2
    except torch.OutOfMemoryError:
        print(
            "error: out of GPU memory while generating; lower --batch_size or --max_new_tokens",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print(file=out or sys.stdout)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
