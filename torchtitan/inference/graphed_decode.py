"""One decoding step with fixed shapes, replayed as a CUDA graph.

Eager decoding of one token launches every kernel of the model from Python (several hundred for
Llama 3 8B, 225 of them matmuls), and the GPU waits on those launches: 8B decoded at 17-30 ms
per token on an H200 whose kernels took about 6 ms (docs/generation.md). A CUDA graph launches
them all at once.

A graph replays fixed shapes and addresses, so the step takes one token and one position per
sequence as GPU tensors (the sequences of a batch may be at different positions), stores the new
keys/values at those positions with an indexed write and attends over the cache's whole length
with a mask of each sequence's positions not yet written. Attention for the one query is two
batched matmuls with float32 sums and a float32 softmax, over the grouped K/V heads as they are.
``decode_step`` is the same computation without the graph (``EagerDecoder``: CPU, ``--eager``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from torchtitan.models.llama3 import Transformer
from torchtitan.models.llama3.kv_cache import KVCache, LayerKVCache
from torchtitan.models.llama3.model import Attention


def matmul_float32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (batches of matrices) with float32 products, sums and result. On a GPU, 16-bit
    inputs go to the matmul as they are (``out_dtype``): float32 copies of the whole cache took
    the 8B step from 8 to 20 ms per token after an 8,192-token prompt."""
    if a.device.type == "cuda" and a.dtype != torch.float32:
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float())


@dataclass
class StepIndex:
    """Where a step stores its keys/values and which cached keys each sequence may not read yet;
    the same for every layer, so computed once per step."""

    slots: torch.Tensor  # (batch * kv_heads,): rows of a layer's keys.view(-1, head_dim) written
    unwritten: torch.Tensor  # (batch, 1, 1, max_len): the positions after each sequence's


def step_index(cache: KVCache, positions: torch.Tensor, key_positions: torch.Tensor) -> StepIndex:
    kv_heads = next(iter(cache.layers.values())).keys.shape[1]
    first_rows = torch.arange(cache.batch_size * kv_heads, device=positions.device) * cache.max_len
    slots = first_rows + positions.repeat_interleave(kv_heads)
    unwritten = key_positions[None, :] > positions[:, None]
    return StepIndex(slots, unwritten[:, None, None, :])


def attend_one(
    attention: Attention, x: torch.Tensor, rope: torch.Tensor, cache: LayerKVCache, at: StepIndex
) -> torch.Tensor:
    """x (batch, 1, dim), each sequence at its position -> the attention's output."""
    batch, head_dim = x.shape[0], attention.head_dim
    xq, xk, xv = attention.rotated_qkv(x, rope)
    cache.keys.view(-1, head_dim).index_copy_(0, at.slots, xk.reshape(-1, head_dim))
    cache.values.view(-1, head_dim).index_copy_(0, at.slots, xv.reshape(-1, head_dim))
    kv_heads, max_len = cache.keys.shape[1], cache.keys.shape[2]
    # (batch * kv_heads, n_rep, head_dim): query head h reads K/V head h // n_rep
    q = xq.view(batch * kv_heads, -1, head_dim)
    keys = cache.keys.view(batch * kv_heads, max_len, head_dim).transpose(1, 2)
    values = cache.values.view(batch * kv_heads, max_len, head_dim)
    scores = (matmul_float32(q, keys) * head_dim**-0.5).view(batch, kv_heads, -1, max_len)
    scores = scores.masked_fill(at.unwritten, float("-inf"))
    # the probabilities in the cache's dtype, as SDPA's kernels round them for this matmul
    probs = F.softmax(scores, dim=-1).to(values.dtype).view(batch * kv_heads, -1, max_len)
    out = matmul_float32(probs, values).to(x.dtype).reshape(batch, 1, -1)
    return attention.wo(out)


def decode_step(
    model: Transformer,
    cache: KVCache,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    key_positions: torch.Tensor,
) -> torch.Tensor:
    """The logits (batch, vocab_size) after ``tokens`` (batch, 1), sequence i's at
    ``positions[i]``, whose earlier positions the cache holds; the tokens' keys and values
    are stored. ``key_positions`` is ``arange(cache.max_len)``."""
    h = model.tok_embeddings(tokens)
    rope = model.rope_cache.index_select(0, positions)[:, None]  # (batch, 1, head_dim)
    at = step_index(cache, positions, key_positions)
    for name, layer in model.layers.items():
        x = layer.attention_norm(h)
        h = h + attend_one(layer.attention, x, rope, cache.layers[name], at)
        h = h + layer.feed_forward(layer.ffn_norm(h))
    return model.output(model.norm(h))[:, -1]


class EagerDecoder:
    """``decoder(tokens, positions)`` -> the logits after them, launched from Python (CPU,
    ``--eager``). Sequences at one position go through the model's own cached forward, which
    launches fewer kernels than ``decode_step`` (8B on an H200: 19-20 against 30-32 ms per
    token, one H200, 2026-11-29); sequences at different positions through ``decode_step``."""

    def __init__(self, model: Transformer, cache: KVCache):
        self.model, self.cache = model, cache
        self.device = model.rope_cache.device
        self.key_positions = torch.arange(cache.max_len, device=self.device)

    def __call__(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        tokens_in = torch.tensor(tokens, device=self.device)[:, None]
        if len(set(positions)) == 1:
            return self.model(tokens_in, cache=self.cache, start_pos=positions[0])[:, -1]
        positions_in = torch.tensor(positions, device=self.device)
        return decode_step(self.model, self.cache, tokens_in, positions_in, self.key_positions)


@functools.cache
def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per GPU for every capture: cuBLAS keeps a workspace per stream it has
    run on, so a new stream per generation held 0.03 GiB more after each (one H200, 2026-11-29)."""
    return torch.cuda.Stream(device)


class GraphedDecoder:
    """``decoder(tokens, positions)`` -> the logits after them, by replaying a captured
    ``decode_step`` over the cache's sequences. The returned tensor is overwritten by the next
    call."""

    def __init__(self, model: Transformer, cache: KVCache):
        device = model.rope_cache.device
        self.tokens = torch.zeros(cache.batch_size, 1, dtype=torch.long, device=device)
        # Warm-up writes its key/value at the cache's last position, which decoding never reads
        # before writing it (the last new token is not fed back), and masks until then.
        self.positions = torch.full((cache.batch_size,), cache.max_len - 1, device=device)
        # Held by self like every input the graph reads: a tensor freed after capture hands its
        # memory to the next allocation, and the replays read whatever is written there.
        self.key_positions = torch.arange(cache.max_len, device=device)

        def step() -> torch.Tensor:
            return decode_step(model, cache, self.tokens, self.positions, self.key_positions)

        # Capture needs the kernels' libraries loaded and the allocator warm: run once on a
        # side stream first, as torch.cuda.graphs asks.
        side = capture_stream(device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=side):
            self.logits = step()

    def __call__(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        self.tokens.copy_(torch.tensor(tokens)[:, None])
        self.positions.copy_(torch.tensor(positions))
        self.graph.replay()
        return self.logits
