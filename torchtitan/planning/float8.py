"""Which linears a ``[float8]`` job runs in float8, decided by the trainer's own rule
(``torchtitan.parallel.float8.shape_skip_reason``: ``filter_fqns``, dims divisible by 16, and with
``skip_small`` the GEMM shapes too small to gain) applied to the model's shapes. The rule is a
pure function of a linear's FQN and shape, so the planner needs neither torchao nor a model.

    setting = Float8Setting.from_config(cfg.float8)      # None without --float8.enable
    converted_linears(setting, shapes(model))            # frozenset({"wq", "wo", "w1", ...})
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.config import Float8
from torchtitan.parallel.float8 import (
    casts_all_gather_in_one_kernel,
    runs_rowwise_backward,
    runs_tensorwise_backward,
    shape_skip_reason,
)
from torchtitan.parallel.float8_tp import scales_tp_shards
from torchtitan.planning.shapes import Shapes

# A block linear's short name -> its FQN below the block; the head is "output".
BLOCK_LINEAR_FQNS = {
    "wq": "attention.wq",
    "wk": "attention.wk",
    "wv": "attention.wv",
    "wo": "attention.wo",
    "w1": "feed_forward.w1",
    "w2": "feed_forward.w2",
    "w3": "feed_forward.w3",
}
HEAD = "output"


@dataclass(frozen=True)
class Float8Setting:
    """The ``[float8]`` options the step model reads (named as ``shape_skip_reason`` reads them)."""

    recipe: str = "tensorwise"
    fsdp_float8_all_gather: bool = False
    skip_small: bool = False
    filter_fqns: tuple[str, ...] = (HEAD,)
    tp_shard_scales: bool = True
    one_kernel_all_gather_cast: bool = False  # the trainer's casts_all_gather_in_one_kernel
    rowwise_backward: bool = False  # the trainer's runs_rowwise_backward
    tensorwise_backward: bool = False  # the trainer's runs_tensorwise_backward

    @classmethod
    def from_config(cls, cfg: Float8) -> Float8Setting | None:
        if not cfg.enable:
            return None
        return cls(
            recipe=cfg.recipe,
            fsdp_float8_all_gather=cfg.fsdp_float8_all_gather,
            skip_small=cfg.skip_small,
            filter_fqns=tuple(cfg.filter_fqns),
            tp_shard_scales=scales_tp_shards(cfg),
            one_kernel_all_gather_cast=casts_all_gather_in_one_kernel(cfg),
            rowwise_backward=runs_rowwise_backward(cfg),
            tensorwise_backward=runs_tensorwise_backward(cfg),
        )

    @property
    def float8_gemm_share(self) -> float:
        """Share of a float8 linear's three GEMMs (output, input gradient, weight gradient) that
        run in float8: rowwise_with_gw_hp keeps the weight gradient's in high precision."""
        return 2 / 3 if self.recipe == "rowwise_with_gw_hp" else 1.0

    def gathers_float8(self, fsdp_degree: int) -> bool:
        """Whether FSDP all-gathers the float8 linears' weights in float8 (1 byte each): the
        trainer turns it on only where FSDP shards (``float8_linear_config``)."""
        return self.fsdp_float8_all_gather and self.recipe == "tensorwise" and fsdp_degree > 1

    def casts_gathers_in_one_kernel(self, fsdp_degree: int) -> bool:
        """Whether each weight shard is cast for FSDP's float8 all-gather by our one kernel."""
        return self.gathers_float8(fsdp_degree) and self.one_kernel_all_gather_cast


def linear_features(model: Shapes) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each block linear and of the head."""
    return {**model.linear_features, HEAD: (model.dim, model.vocab)}


def converted_linears(setting: Float8Setting | None, model: Shapes) -> frozenset[str]:
    """Short names (wq ... w3, "output") of the linears the trainer converts to float8; the
    same for every block, since the rule reads only the name below the block and the shape."""
    if setting is None:
        return frozenset()
    converted = set()
    for name, (k, n) in linear_features(model).items():
        fqn = HEAD if name == HEAD else f"layers.0.{BLOCK_LINEAR_FQNS[name]}"
        if shape_skip_reason(fqn, k, n, setting) is None:
            converted.add(name)
    return frozenset(converted)
