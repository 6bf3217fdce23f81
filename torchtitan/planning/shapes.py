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
    ffn: int  # the dense SwiGLU's hidden size; 0 in MoE blocks, which have none
    vocab: int
    # Mixture of Experts (every block): routed experts, how many each token reaches, each one's
    # SwiGLU hidden size, and the shared experts' hidden size (num_shared x hidden). 0: dense.
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    # Attention projections other than GQA's wq/wk/wv/wo, as (name, in, out): multi-head latent
    # attention's latent and up-projections. Empty: GQA's, from q and kv.
    attention: tuple[tuple[str, int, int], ...] = ()

    @property
    def linear_features(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of a block's projections (nn.Linear modules named as in a
        dense block), by name: a MoE block has only the attention's (see ``moe_params``)."""
        d, q, kv, f = self.dim, self.q, self.kv, self.ffn
        attention = {"wq": (d, q), "wk": (d, kv), "wv": (d, kv), "wo": (q, d)}
        if self.attention:
            attention = {name: (k, n) for name, k, n in self.attention}
        if self.experts:
            return attention
        return {**attention, "w1": (d, f), "w2": (f, d), "w3": (d, f)}

    @property
    def linears(self) -> dict[str, int]:
        """Weights of a block's projections, by name."""
        return {name: k * n for name, (k, n) in self.linear_features.items()}

    @functools.cached_property
    def block_linear(self) -> int:
        return sum(self.linears.values())

    @functools.cached_property
    def block_params(self) -> int:
        """The block's weights outside a MoE layer: projections + the two RMSNorm weights."""
        return self.block_linear + 2 * self.dim

    @property
    def expert_params(self) -> int:
        """One routed expert's SwiGLU (w1, w2, w3)."""
        return 3 * self.dim * self.expert_ffn

    @property
    def moe_always_params(self) -> int:
        """The weights of a MoE layer that every token passes: router gate + shared experts."""
        return self.dim * self.experts + 3 * self.dim * self.shared_ffn

    @property
    def moe_params(self) -> int:
        """A MoE layer's weights (0 in a dense block): router, shared and every routed expert."""
        return self.moe_always_params + self.experts * self.expert_params

    @property
    def moe_active_params(self) -> int:
        """A MoE layer's weights one token passes through: router, shared and top_k experts."""
        return self.moe_always_params + self.top_k * self.expert_params


def shapes(model: ModelArgs | Shapes) -> Shapes:
    """The sizes of any family's shape (its args have the fields Llama's have, and ``moe``
    (MoEArgs) where every block is a MoE one; a tied embedding table is counted as two, as the
    planner's estimates of it are)."""
    if isinstance(model, Shapes):
        return model
    if hasattr(model, "attention_linears"):
        return _latent_attention_shapes(model)
    moe = getattr(model, "moe", None)
    routing = (
        (moe.num_experts, moe.top_k, moe.hidden_dim, moe.num_shared_experts * moe.hidden_dim)
        if moe is not None
        else ()
    )
    return _shapes(
        model.dim,
        model.n_layers,
        model.n_heads,
        model.kv_heads,
        model.head_dim,
        model.ffn_hidden_dim,
        model.vocab_size,
        routing,
    )


@functools.lru_cache(maxsize=64)
def _shapes(dim, n_layers, n_heads, kv_heads, head_dim, ffn, vocab, routing) -> Shapes:
    experts, top_k, expert_ffn, shared_ffn = routing or (0, 0, 0, 0)
    return Shapes(
        dim=dim,
        n_layers=n_layers,
        heads=n_heads,
        head_dim=head_dim,
        q=n_heads * head_dim,
        kv=kv_heads * head_dim,
        ffn=0 if experts else ffn,  # a MoE flavor's ffn_hidden_dim is only carried for HF
        vocab=vocab,
        experts=experts,
        top_k=top_k,
        expert_ffn=expert_ffn,
        shared_ffn=shared_ffn,
    )


def _latent_attention_shapes(model) -> Shapes:
    """A DeepSeek-V3 shape: its MLA projections as they are; for the activations, queries and
    keys qk_head_dim wide per head and values v_head_dim (``kv`` their mean, as k and v each count
    it once); the latents (kv_lora_rank + qk_rope_head_dim, q_lora_rank wide per token) are not
    counted. Its few dense blocks are counted as MoE blocks (more weights: an overestimate)."""
    moe, h = model.moe, model.n_heads
    linears = tuple((name, k, n) for name, (k, n) in model.attention_linears().items())
    return Shapes(
        dim=model.dim,
        n_layers=model.n_layers,
        heads=h,
        head_dim=model.qk_head_dim,
        q=h * model.qk_head_dim,
        kv=h * (model.qk_head_dim + model.v_head_dim) // 2,
        ffn=0,
        vocab=model.vocab_size,
        experts=moe.num_experts,
        top_k=moe.top_k,
        expert_ffn=moe.hidden_dim,
        shared_ffn=moe.num_shared_experts * moe.hidden_dim,
        attention=linears,
    )
