"""The model sizes the step model reads, computed once per model (the search asks thousands of
times)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from torchtitan.models.llama3 import ModelArgs


@dataclass(frozen=True)
class Shapes:
    dim: int
    n_layers: int
    heads: int
    head_dim: int
    q: int  # query width: heads x head_dim
    kv: int  # key (and value) width: kv_heads x head_dim
    ffn: int
    vocab: int

    @property
    def linear_features(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of a block's projections, by name."""
        d, q, kv, f = self.dim, self.q, self.kv, self.ffn
        return {
            "wq": (d, q),
            "wk": (d, kv),
            "wv": (d, kv),
            "wo": (q, d),
            "w1": (d, f),
            "w2": (f, d),
            "w3": (d, f),
        }

    @property
    def linears(self) -> dict[str, int]:
        """Weights of a block's projections, by name."""
        return {name: k * n for name, (k, n) in self.linear_features.items()}

    @functools.cached_property
    def block_linear(self) -> int:
        return sum(self.linears.values())

    @functools.cached_property
    def block_params(self) -> int:
        return self.block_linear + 2 * self.dim  # + the two RMSNorm weights


def shapes(model: ModelArgs | Shapes) -> Shapes:
    """The sizes of any family's dense shape (its args have the fields Llama's have; a tied
    embedding table is counted as two, as the planner's estimates of it are)."""
    if isinstance(model, Shapes):
        return model
    return _shapes(
        model.dim,
        model.n_layers,
        model.n_heads,
        model.kv_heads,
        model.head_dim,
        model.ffn_hidden_dim,
        model.vocab_size,
    )


@functools.lru_cache(maxsize=64)
def _shapes(dim, n_layers, n_heads, kv_heads, head_dim, ffn, vocab) -> Shapes:
    return Shapes(
        dim=dim,
        n_layers=n_layers,
        heads=n_heads,
        head_dim=head_dim,
        q=n_heads * head_dim,
        kv=kv_heads * head_dim,
        ffn=ffn,
        vocab=vocab,
    )
