"""Token-by-token generation with a KV cache: prefill the prompt in one pass, then one token per
step; greedy (temperature 0) or top-k sampling from a seeded generator."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from torchtitan.inference.graphed_decode import GraphedDecoder
from torchtitan.models.llama3 import Transformer
from torchtitan.models.llama3.kv_cache import KVCache


@dataclass
class Sampling:
    temperature: float = 0.8  # 0: greedy (argmax)
    top_k: int = 50  # sample among the k most likely tokens; 0: the whole vocabulary
    seed: int = 0

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"--temperature must be >= 0 (0 = greedy); got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"--top_k must be >= 0 (0 = no limit); got {self.top_k}")


class TokenSampler:
    """Picks the next token from logits; sampling draws from a CPU generator seeded once, so a
    seed gives the same tokens on every run (for the same logits). With ``vocab_size`` (the
    tokenizer's), ids at and past it are never picked: a model may have more outputs than its
    tokenizer has tokens, and the tokenizer cannot decode those."""

    def __init__(self, sampling: Sampling, vocab_size: int | None = None):
        sampling.validate()
        self.sampling = sampling
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(sampling.seed)

    def __call__(self, logits: torch.Tensor) -> int:
        """logits: (vocab_size,) for the next position."""
        if self.vocab_size is not None:
            logits = logits[: self.vocab_size]  # a prefix: the ids stay the same
        if self.sampling.temperature == 0:
            return int(logits.argmax())
        logits = logits.float()
        k = self.sampling.top_k
        if 0 < k < logits.numel():
            logits, candidates = torch.topk(logits, k)
        else:
            candidates = None
        probs = torch.softmax(logits / self.sampling.temperature, dim=-1).cpu()
        choice = int(torch.multinomial(probs, 1, generator=self.generator))
        return choice if candidates is None else int(candidates[choice])


def model_dtype(model: Transformer) -> torch.dtype:
    return next(model.parameters()).dtype


def last_position_logits(
    model: Transformer, tokens: torch.Tensor, cache: KVCache, start_pos: int
) -> torch.Tensor:
    """The logits of the first sequence's last position (vocab_size,). The head runs on that one
    position: over a whole prompt it would write prompt length x vocabulary logits (2 GiB in
    bf16 for 8,192 tokens of Llama 3's 128,256) to keep one row."""
    model.defer_head = True
    try:
        hidden = model(tokens, cache=cache, start_pos=start_pos)  # normed, before the head
    finally:
        model.defer_head = False
    return model.output(hidden[:, -1:])[0, -1]


def eager_decoder(model: Transformer, cache: KVCache) -> Callable[[int, int], torch.Tensor]:
    device = model.rope_cache.device

    def decode(token: int, position: int) -> torch.Tensor:
        return last_position_logits(model, torch.tensor([[token]], device=device), cache, position)

    return decode


@torch.inference_mode()
def generate_tokens(
    model: Transformer,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampler: Callable[[torch.Tensor], int],
    eos_id: int | None = None,
    cuda_graph: bool = True,
) -> Iterator[int]:
    """Yield up to ``max_new_tokens`` new token ids continuing ``prompt_ids``; stops after
    yielding ``eos_id``. The model needs ``len(prompt_ids) + max_new_tokens <= max_seq_len``.
    On a GPU the tokens after the first are decoded by a CUDA graph (``GraphedDecoder``) unless
    ``cuda_graph`` is false."""
    if not prompt_ids:
        raise ValueError("the prompt has no tokens (start it with BOS)")
    if max_new_tokens <= 0:
        return
    device = model.rope_cache.device
    cache = KVCache(
        model.args,
        batch_size=1,
        max_len=len(prompt_ids) + max_new_tokens,
        device=device,
        dtype=model_dtype(model),
    )
    tokens = torch.tensor([list(prompt_ids)], device=device)
    logits = last_position_logits(model, tokens, cache, start_pos=0)
    position, decode = len(prompt_ids), None
    for step in range(max_new_tokens):
        token = sampler(logits)
        yield token
        if token == eos_id or step == max_new_tokens - 1:
            return
        if decode is None:  # only once a second token is wanted: capturing runs a step
            graphed = cuda_graph and device.type == "cuda"
            decode = GraphedDecoder(model, cache) if graphed else eager_decoder(model, cache)
        logits = decode(token, position)
        position += 1
