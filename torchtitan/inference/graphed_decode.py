"""One decoding step with fixed shapes, replayed as a CUDA graph.

Eager decoding of one token launches every kernel of the model from Python (several hundred for
Llama 3 8B, 225 of them matmuls), and the GPU waits on those launches: 8B decoded at 17-30 ms
per token on an H200 whose kernels took about 6 ms (docs/generation.md). A CUDA graph launches
them all at once.

A graph replays fixed shapes and addresses, so the step takes its token and position as GPU
tensors, writes the new key/value at that position with ``index_copy_`` and attends over the
cache's whole length with a mask of the positions not yet written. Attention for the one query
is two matmuls with float32 sums and a float32 softmax, over the grouped K/V heads as they are.
``decode_step`` is the same computation without the graph (CPU, tests).
"""

from __future__ import annotations

import functools

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


def attend_one(
    attention: Attention,
    x: torch.Tensor,
    rope: torch.Tensor,
    cache: LayerKVCache,
    position: torch.Tensor,
    key_positions: torch.Tensor,
) -> torch.Tensor:
    """x (1, 1, dim) at ``position`` (a one-element tensor) -> the attention's output."""
    head_dim = attention.head_dim
    xq, xk, xv = attention.rotated_qkv(x, rope)
    cache.keys.index_copy_(1, position, xk)
    cache.values.index_copy_(1, position, xv)
    q = xq.view(xk.shape[2], -1, head_dim)  # (kv_heads, n_rep, head_dim): head h reads h // n_rep
    keys = cache.keys[0].permute(1, 2, 0)  # (kv_heads, head_dim, max_len)
    values = cache.values[0].transpose(0, 1)  # (kv_heads, max_len, head_dim)
    scores = matmul_float32(q, keys) * head_dim**-0.5
    scores = scores.masked_fill(key_positions > position, float("-inf"))
    # the probabilities in the cache's dtype, as SDPA's kernels round them for this matmul
    probs = F.softmax(scores, dim=-1).to(values.dtype)
    return attention.wo(matmul_float32(probs, values).to(x.dtype).reshape(1, 1, -1))


def decode_step(
    model: Transformer,
    cache: KVCache,
    token: torch.Tensor,
    position: torch.Tensor,
    key_positions: torch.Tensor,
) -> torch.Tensor:
    """The logits (vocab_size,) after ``token`` (1, 1) at ``position`` (1,), whose earlier
    positions the cache (of one sequence) holds; the token's key and value are stored."""
    h = model.tok_embeddings(token)
    rope = model.rope_cache.index_select(0, position)
    for name, layer in model.layers.items():
        x = layer.attention_norm(h)
        h = h + attend_one(layer.attention, x, rope, cache.layers[name], position, key_positions)
        h = h + layer.feed_forward(layer.ffn_norm(h))
    return model.output(model.norm(h))[0, -1]


@functools.cache
def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per GPU for every capture: cuBLAS keeps a workspace per stream it has
    run on, so a new stream per generation held 0.03 GiB more after each (call 108)."""
    return torch.cuda.Stream(device)


class GraphedDecoder:
    """``decoder(token, position)`` -> the logits after it, by replaying a captured
    ``decode_step``. The returned tensor is overwritten by the next call."""

    def __init__(self, model: Transformer, cache: KVCache):
        if next(iter(cache.layers.values())).keys.shape[0] != 1:
            raise ValueError("graphed decoding takes a KV cache of one sequence")
        device = model.rope_cache.device
        self.token = torch.zeros(1, 1, dtype=torch.long, device=device)
        # Warm-up writes its key/value at the cache's last position, which decoding never reads
        # before writing it (the last new token is not fed back), and masks until then.
        self.position = torch.full((1,), cache.max_len - 1, device=device)
        # Held by self like every input the graph reads: a tensor freed after capture hands its
        # memory to the next allocation, and the replays read whatever is written there.
        self.key_positions = torch.arange(cache.max_len, device=device)

        def step() -> torch.Tensor:
            return decode_step(model, cache, self.token, self.position, self.key_positions)

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

    def __call__(self, token: int, position: int) -> torch.Tensor:
        self.token.fill_(token)
        self.position.fill_(position)
        self.graph.replay()
        return self.logits
