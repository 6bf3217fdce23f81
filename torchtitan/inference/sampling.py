"""Picking the next tokens from logits: greedy (temperature 0), or sampling at a temperature among
the top k and/or the top-p nucleus, each sequence from its own seeded generator."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Sampling:
    temperature: float = 0.8  # 0: greedy (argmax)
    top_k: int = 50  # sample among the k most likely tokens; 0: the whole vocabulary
    seed: int = 0
    top_p: float = 1.0  # then among the fewest likeliest tokens holding p of the probability

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"--temperature must be >= 0 (0 = greedy); got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"--top_k must be >= 0 (0 = no limit); got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top_p must be in (0, 1] (1 = no limit); got {self.top_p}")


def sequence_seed(seed: int, sequence: int) -> int:
    """The generator seed of sequence ``sequence`` of a run with ``--seed seed``: the seed itself
    for the first sequence (what one prompt alone uses), a mix of both for the others (SplitMix64's
    finalizer), so the runs of nearby seeds do not share samples as ``seed + sequence`` would."""
    if sequence == 0:
        return seed
    z = (seed + sequence * 0x9E3779B97F4A7C15) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return (z ^ (z >> 31)) >> 1  # 63 bits: torch.Generator.manual_seed takes them


class TokenSampler:
    """Picks the next token of each of ``sequences`` sequences. Sequence i draws from a CPU
    generator seeded once with ``sequence_seed(seed, first_sequence + i)``, so its tokens depend
    on its seed and its logits only, not on the batch it is decoded in or on the other sequences.
    With
    ``vocab_size`` (the tokenizer's), ids at and past it are never picked: a model may have more
    outputs than its tokenizer has tokens, and the tokenizer cannot decode those."""

    def __init__(
        self,
        sampling: Sampling,
        vocab_size: int | None = None,
        sequences: int = 1,
        first_sequence: int = 0,
    ):
        sampling.validate()
        self.sampling = sampling
        self.vocab_size = vocab_size
        sequence_ids = range(first_sequence, first_sequence + sequences)
        seeds = [sequence_seed(sampling.seed, i) for i in sequence_ids]
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]

    def sample(self, logits: torch.Tensor) -> list[int]:
        """logits: (sequences, vocab_size) for each sequence's next position."""
        if logits.shape[0] != len(self.generators):
            raise ValueError(
                f"logits of {logits.shape[0]} sequences for a sampler of {len(self.generators)}"
            )
        if self.vocab_size is not None:
            logits = logits[:, : self.vocab_size]  # a prefix: the ids stay the same
        if self.sampling.temperature == 0:
            return logits.argmax(dim=-1).tolist()
        logits = logits.float()
        k = self.sampling.top_k
        candidates = None
        if 0 < k < logits.shape[-1]:
            logits, candidates = torch.topk(logits, k, dim=-1)
            candidates = candidates.cpu()
        probs = torch.softmax(logits / self.sampling.temperature, dim=-1)
        if self.sampling.top_p < 1:
            probs = nucleus(probs, self.sampling.top_p)
        probs = probs.cpu()
        picks = [
            int(torch.multinomial(row, 1, generator=generator))
            for row, generator in zip(probs, self.generators)
        ]
        if candidates is None:
            return picks
        return [int(row[pick]) for row, pick in zip(candidates, picks)]

    def __call__(self, logits: torch.Tensor) -> int:
        """The one sequence's next token; logits: (vocab_size,)."""
        return self.sample(logits[None])[0]


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs (sequences, n) with each row's smallest set of likeliest entries whose probabilities
    sum to at least ``top_p`` kept and the rest zeroed (the likeliest is always kept); the rows
    are not renormalized (``torch.multinomial`` takes weights)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # the mass of the likelier entries
    sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
