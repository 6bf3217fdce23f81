"""Token-by-token generation with a KV cache, for one sequence or a batch: the prompts' pass,
then one token per sequence per step, replayed as a CUDA graph on a GPU.

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

# Padded prompt tokens per forward of the prompts' pass: bounds its activations (8B: about 1.4 GiB
# of feed-forward intermediates for 16,384 tokens in bf16) whatever the batch.
PROMPT_PASS_TOKENS = 16384


def model_dtype(model: Transformer) -> torch.dtype:
    return next(model.parameters()).dtype


def prompts_pass(
    model: Transformer, prompts: Sequence[Sequence[int]], max_len: int
) -> tuple[KVCache, torch.Tensor]:
    """Run each distinct prompt through the model once -> a cache of one sequence per prompt
    and ``max_len`` positions, holding the prompts' keys and values, and the logits after each
    prompt (len(prompts), vocab_size). Samples of one prompt share its pass.

    The distinct prompts go through in groups of at most ``PROMPT_PASS_TOKENS`` padded tokens
    (a longer prompt alone), so the pass's activations stay bounded whatever the batch; each
    group's keys and values are copied into the rows of its sequences. One group of distinct
    prompts in order is passed straight into the cache (no copy, no second cache: one long
    prompt's case). The head runs on the last position of each prompt only: over whole prompts
    it would write prompt length x vocabulary logits (2 GiB in bf16 for 8,192 tokens of Llama 3's
    128,256)."""
    if not all(prompts):
        raise ValueError("a prompt has no tokens (start it with BOS)")
    device, dtype = model.rope_cache.device, model_dtype(model)
    distinct = list(dict.fromkeys(tuple(p) for p in prompts))
    groups = prompt_groups(distinct)
    cache = KVCache(model.args, len(prompts), max_len, device=device, dtype=dtype)
    if len(groups) == 1 and len(distinct) == len(prompts):
        return cache, last_logits(model, distinct, cache)
    logits = None
    for group in groups:
        longest = max(map(len, group))
        staged = KVCache(model.args, len(group), longest, device=device, dtype=dtype)
        group_logits = last_logits(model, group, staged)
        index = {prompt: row for row, prompt in enumerate(group)}
        sequences = [i for i, p in enumerate(prompts) if tuple(p) in index]
        rows = torch.tensor([index[tuple(prompts[i])] for i in sequences], device=device)
        targets = torch.tensor(sequences, device=device)
        cache.copy_rows(staged, rows, longest, targets)
        if logits is None:
            logits = group_logits.new_empty(len(prompts), group_logits.shape[-1])
        logits.index_copy_(0, targets, group_logits.index_select(0, rows))
    return cache, logits


def prompt_groups(prompts: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """Consecutive prompts in groups of at most PROMPT_PASS_TOKENS tokens once padded to the
    group's longest (a prompt longer than that alone)."""
    groups: list[list[tuple[int, ...]]] = []
    for prompt in prompts:
        if groups:
            group = groups[-1]
            if (len(group) + 1) * max(len(prompt), *map(len, group)) <= PROMPT_PASS_TOKENS:
                group.append(prompt)
                continue
        groups.append([prompt])
    return groups


def last_logits(model: Transformer, prompts: list[tuple[int, ...]], cache: KVCache) -> torch.Tensor:
    """One causal pass over ``prompts`` right-padded to the longest, their keys and values into
    ``cache`` (one sequence each) -> the logits after each prompt's last token."""
    device = model.rope_cache.device
    padded = torch.zeros(len(prompts), max(map(len, prompts)), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        padded[row, : len(prompt)] = torch.tensor(prompt)
    model.defer_head = True
    try:
        hidden = model(padded.to(device), cache=cache, start_pos=0)  # normed, before the head
    finally:
        model.defer_head = False
    last = torch.tensor([len(p) - 1 for p in prompts], device=device)
    rows = torch.arange(len(prompts), device=device)
    return model.output(hidden[rows, last][:, None])[:, 0]


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
