"""``ModelFamily``: what the composition (torchtitan.parallel.compose) needs to know about a
model family, declared once per family as data. The composition reads these declarations; it
never names a family's modules itself."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelFamily:
    name: str
    # The model: its class (built from its args, on the meta device by the trainer), its named
    # shapes, and the args of the ``[model]`` section (flavor + overrides, RoPE cache for a
    # sequence length; ConfigError, one line, on a bad combination).
    model_class: Callable[[Any], Any]
    flavors: Mapping[str, Any]
    args_from_config: Callable[[Any, int], Any]
    # Where the model keeps its parts. A pipeline stage drops the input modules on all but the
    # first stage and the output modules on all but the last.
    blocks_attr: str  # an nn.ModuleDict / nn.ModuleList of the repeated blocks
    input_modules: tuple[str, ...]  # embeddings: one FSDP group
    output_modules: tuple[str, ...]  # final norm + head: one FSDP group
    # Tensor + sequence parallel plans (module FQN -> torch ParallelStyle): one for each block,
    # one for the root (its argument: whether the head leaves the logits vocabulary-sharded).
    block_tp_plan: Callable[[], dict[str, Any]]
    root_tp_plan: Callable[[bool], dict[str, Any]]
    # The plan of a block whose feed-forward is a MoE layer, when the family has them.
    moe_block_tp_plan: Callable[[], dict[str, Any]] | None = None
    # Float8: linears kept in high precision by default, and those whose input (fed by a norm)
    # is cast for the weight gradient in a tiled kernel rather than inside the norm's backward.
    float8_exclude: tuple[str, ...] = ("output",)
    float8_tiled_cast: tuple[str, ...] = ()
    # The SwiGLU feed-forward of a block (attributes w1, w2, w3), for the experimental fused
    # float8 SwiGLU; empty when the family has none.
    swiglu_attr: str = ""
    # Why a parallelism this family's args cannot run under yet (one line), or None:
    # ``(args, dims) -> str | None``.
    unsupported: Callable[[Any, Any], str | None] = field(default=lambda args, dims: None)
