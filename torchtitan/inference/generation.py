"""Token-by-token generation with a KV cache, for one sequence or a batch: the prompts in one
pass, then one token per sequence per step, replayed as a CUDA graph on a GPU.

The sequences of a batch start at position 0 and decode in lockstep, each at its own position
(its prompt's length plus the tokens so far). The prompts' pass right-pads them to the longest:
a causal model's real positions never see the padding after them, and decoding overwrites each
padded position of the cache before its mask lets a query read it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from torchtitan.inference.graphed_decode import EagerDecoder, GraphedDecoder
from torchtitan.inference.sampling import TokenSampler
from torchtitan.models.llama3 import Transformer
from torchtitan.models.llama3.kv_cache import KVCache


def model_dtype(model: Transformer) -> torch.dtype:
    return next(model.parameters()).dtype


def prompts_pass(
    model: Transformer, prompts: Sequence[Sequence[int]], max_len: int
) -> tuple[KVCache, torch.Tensor]:
    """Run each distinct prompt through the model once -> a cache of one sequence per prompt
    and ``max_len`` positions, holding the prompts' keys and values, and the logits after each
    prompt (len(prompts), vocab_size). Samples of one prompt share its pass.

    The head runs on the last position of each prompt only: over whole prompts it would write
    prompt length x vocabulary logits (2 GiB in bf16 for 8,192 tokens of Llama 3's 128,256)."""
    if not all(prompts):
        raise ValueError("a prompt has no tokens (start it with BOS)")
    device = model.rope_cache.device
    distinct = list(dict.fromkeys(tuple(p) for p in prompts))
    longest = max(len(p) for p in distinct)
    padded = torch.zeros(len(distinct), longest, dtype=torch.long)
    for row, prompt in enumerate(distinct):
        padded[row, : len(prompt)] = torch.tensor(prompt)
    cache = KVCache(model.args, len(distinct), max_len, device=device, dtype=model_dtype(model))
    model.defer_head = True
    try:
        hidden = model(padded.to(device), cache=cache, start_pos=0)  # normed, before the head
    finally:
        model.defer_head = False
    last = torch.tensor([len(p) - 1 for p in distinct], device=device)
    logits = model.output(hidden[torch.arange(len(distinct), device=device), last][:, None])[:, 0]
    if len(distinct) == len(prompts):  # each prompt once, in order
        return cache, logits
    rows = torch.tensor([distinct.index(tuple(p)) for p in prompts], device=device)
    expanded = KVCache(model.args, len(prompts), max_len, device=device, dtype=model_dtype(model))
    expanded.copy_rows(cache, rows, longest)
    return expanded, logits.index_select(0, rows)


@torch.inference_mode()
def generate_batch(
    model: Transformer,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampler: TokenSampler,
    eos_id: int | None = None,
    cuda_graph: bool = True,
) -> Iterator[list[int]]:
    """Yield each step's new token of every sequence (a list of len(prompts)), up to
    ``max_new_tokens`` steps; stops once every sequence has yielded ``eos_id`` (a sequence's
    tokens after its EOS mean nothing). The model needs ``len(prompt) + max_new_tokens <=
    max_seq_len`` for the longest prompt. On a GPU the steps after the first are replayed as a
    CUDA graph (``GraphedDecoder``) unless ``cuda_graph`` is false."""
    if max_new_tokens <= 0:
        return
    longest = max(len(p) for p in prompts)
    cache, logits = prompts_pass(model, prompts, longest + max_new_tokens)
    positions = [len(p) for p in prompts]
    ended = [False] * len(prompts)
    decode = None
    for step in range(max_new_tokens):
        tokens = sampler.sample(logits)
        yield tokens
        ended = [e or t == eos_id for e, t in zip(ended, tokens)]
        if all(ended) or step == max_new_tokens - 1:
            return
        if decode is None:  # only once a second token is wanted: capturing runs a step
            graphed = cuda_graph and model.rope_cache.device.type == "cuda"
            decode = (GraphedDecoder if graphed else EagerDecoder)(model, cache)
        logits = decode(tokens, positions)
        positions = [p + 1 for p in positions]


def generate_tokens(
    model: Transformer,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampler: TokenSampler,
    eos_id: int | None = None,
    cuda_graph: bool = True,
) -> Iterator[int]:
    """Yield up to ``max_new_tokens`` new token ids continuing ``prompt_ids``; stops after
    yielding ``eos_id``. ``generate_batch`` for one sequence."""
    for tokens in generate_batch(model, [prompt_ids], max_new_tokens, sampler, eos_id, cuda_graph):
        yield tokens[0]
