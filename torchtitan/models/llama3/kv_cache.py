"""Key/value cache for incremental decoding: ``Transformer.forward(tokens, cache, start_pos)``.

Each layer keeps the rotated keys and the values of every position decoded so far, so a new
token's attention reads them instead of recomputing the whole prefix. Training never uses it.
"""

from __future__ import annotations

import torch

from torchtitan.models.llama3.args import ModelArgs


class LayerKVCache:
    """One layer's keys and values, (batch, n_kv_heads, max_len, head_dim) each: heads before
    positions, so each sequence's head is one (max_len, head_dim) matrix and a batch's heads
    are one stack of them, which a batched matmul reads in place (graphed_decode.py)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys = keys
        self.values = values

    def update(
        self, xk: torch.Tensor, xv: torch.Tensor, start_pos: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the keys/values of positions ``start_pos ...``; -> those of every position so
        far (0 to the last one stored)."""
        end = start_pos + xk.shape[1]
        self.keys[:, :, start_pos:end] = xk.transpose(1, 2)
        self.values[:, :, start_pos:end] = xv.transpose(1, 2)
        # views in the model's (batch, positions, heads, head_dim) order
        return self.keys[:, :, :end].transpose(1, 2), self.values[:, :, :end].transpose(1, 2)


class KVCache:
    """Per-layer K/V buffers for ``batch_size`` sequences of up to ``max_len`` positions.

    ``layers`` is keyed like ``Transformer.layers`` (the layer index as a string).
    """

    def __init__(
        self,
        args: ModelArgs,
        batch_size: int,
        max_len: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        if max_len > args.max_seq_len:
            raise ValueError(
                f"a cache of {max_len} positions exceeds the model's max_seq_len "
                f"{args.max_seq_len} (the RoPE cache length)"
            )
        self.max_len = max_len
        self.batch_size = batch_size
        shape = (batch_size, args.kv_heads, max_len, args.head_dim)
        self.layers = {
            str(i): LayerKVCache(
                torch.zeros(shape, device=device, dtype=dtype),
                torch.zeros(shape, device=device, dtype=dtype),
            )
            for i in range(args.n_layers)
        }

    def copy_rows(
        self, source: KVCache, rows: torch.Tensor, length: int, targets: torch.Tensor
    ) -> None:
        """Positions 0..length-1 of sequence ``targets[i]`` from ``source``'s sequence
        ``rows[i]`` (several targets may share one row, e.g. samples of one prompt)."""
        for name, layer in self.layers.items():
            src = source.layers[name]
            for mine, theirs in ((layer.keys, src.keys), (layer.values, src.values)):
                mine[:, :, :length].index_copy_(
                    0, targets, theirs[:, :, :length].index_select(0, rows)
                )

    def check_fits(self, start_pos: int, seqlen: int) -> None:
        if start_pos < 0 or start_pos + seqlen > self.max_len:
            raise ValueError(
                f"positions {start_pos}..{start_pos + seqlen - 1} do not fit a KV cache of "
                f"{self.max_len} positions"
            )


def cached_attention_mask(seqlen: int, start_pos: int, device: torch.device) -> torch.Tensor | None:
    """Boolean (seqlen, start_pos + seqlen) mask for new queries at ``start_pos ...`` over every
    cached key: query i sees keys 0..start_pos + i. None when a single query sees them all.

    SDPA's ``is_causal`` aligns the triangle to the top-left corner, which is only right when
    there is no earlier key (``start_pos == 0``); chunks after the first need this mask.
    """
    if seqlen == 1:
        return None
    query_pos = torch.arange(start_pos, start_pos + seqlen, device=device)[:, None]
    key_pos = torch.arange(start_pos + seqlen, device=device)[None, :]
    return key_pos <= query_pos
