"""The output of several generated sequences: a header line and the text of each, the
``--output`` JSON-lines file, and the closing summary (``torchtitan.generate`` decodes them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from torchtitan.inference.sampling import sequence_seed

if TYPE_CHECKING:
    from torchtitan.generate import GenerationJob


def stop_reason(ids: list[int], eos_id: int | None) -> str:
    return "EOS" if ids[-1] == eos_id else "--max_new_tokens"


def until_eos(steps: Iterator[list[int]], sequences: int, eos_id: int | None) -> list[list[int]]:
    """Each sequence's new tokens from ``generate_batch``'s steps, through its EOS if any."""
    ids: list[list[int]] = [[] for _ in range(sequences)]
    for tokens in steps:
        for seq, token in zip(ids, tokens):
            if not seq or seq[-1] != eos_id:
                seq.append(token)
    return ids


class ResultsFile:
    """``--output``: one JSON object per continuation, written as each batch ends (a run that
    is stopped keeps the batches it finished). Created with ``x``: never overwrites."""

    def __init__(self, path: str):
        self.file = open(Path(path).expanduser(), "x", encoding="utf-8") if path else None

    def write(self, job: GenerationJob, sequence: int, ids: list[int]) -> None:
        if self.file is None:
            return
        prompt, sample = divmod(sequence, job.options.num_samples)
        eos_id = job.tokenizer.eos_id
        record = {
            "prompt_index": prompt,
            "sample": sample,
            "seed": sequence_seed(job.options.sampling.seed, sequence),
            "prompt": job.prompts[prompt],
            "completion": job.tokenizer.decode([i for i in ids if i != eos_id]),
            "token_ids": ids,
            "stopped_at": stop_reason(ids, eos_id).lstrip("-"),
        }
        self.file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def header(job: GenerationJob, sequence: int, ids: list[int]) -> str:
    """``--- prompt 2 of 3, sample 1 of 4: 24 tokens, stopped at EOS ---``."""
    prompt, sample = divmod(sequence, job.options.num_samples)
    which = f"prompt {prompt + 1} of {len(job.prompts)}"
    if job.options.num_samples > 1:
        which += f", sample {sample + 1} of {job.options.num_samples}"
    return (
        f"--- {which}: {len(ids)} tokens, stopped at {stop_reason(ids, job.tokenizer.eos_id)} ---"
    )


def completed_text(job: GenerationJob, sequence: int, ids: list[int]) -> str:
    new = job.tokenizer.decode([i for i in ids if i != job.tokenizer.eos_id])
    return job.prompts[sequence // job.options.num_samples] + new + "\n"


def batches_summary(job: GenerationJob, all_ids: list[list[int]], seconds: float) -> str:
    """``6 sequences in 2 batches of up to 4: 131 new tokens in 1.20s, 109.2 tokens/s; 1
    stopped at EOS``."""
    tokens = sum(map(len, all_ids))
    batches = -(-len(all_ids) // job.options.batch_size)
    eos = sum(ids[-1] == job.tokenizer.eos_id for ids in all_ids)
    return (
        f"{len(all_ids)} sequences in {batches} batch{'es' if batches > 1 else ''} of up to "
        f"{job.options.batch_size}: {tokens} new tokens in {seconds:.2f}s, "
        f"{tokens / seconds:.1f} tokens/s; {eos} stopped at EOS"
    )
