"""Which linears a ``[float8]`` job runs in float8, decided by the trainer's own rule
(``torchtitan.float8.convert.shape_skip_reason``: the model family's exclusions,
``filter_fqns`` and dims divisible by 16) applied to the model's shapes, and which of the
trainer's float8 code paths run. The rule is a pure function of a linear's FQN and shape, so
the planner needs neither torchao nor a model.

    setting = Float8Setting.from_config(cfg.float8, family.float8_exclude)  # None if off
    converted_linears(setting, shapes(model))            # frozenset({"wq", "wo", "w1", ...})
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.config import Float8
from torchtitan.float8.convert import shape_skip_reason
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
    """The ``[float8]`` options the step model reads (named as ``shape_skip_reason`` reads them),
    and three code paths of the trainer that no option selects: they are on wherever they apply.
    ``compare.py`` turns them off for the measured points of older code that ran torchao's
    instead (tests/unit/data/planning_measured.toml)."""

    recipe: str = "tensorwise"
    fsdp_float8_all_gather: bool = False
    precompute_scales: bool = False
    filter_fqns: tuple[str, ...] = ()
    model_exclude: tuple[str, ...] = (HEAD,)  # the model family's float8_exclude (Llama's)
    own_backward: bool = True  # our tensorwise / rowwise backward (torchtitan/float8/)
    tp_shard_scales: bool = True  # tensorwise under TP: each shard scaled on its own
    one_kernel_all_gather_cast: bool = True  # FSDP's float8 all-gather cast in one kernel

    @classmethod
    def from_config(cls, cfg: Float8, model_exclude: tuple[str, ...]) -> Float8Setting | None:
        if not cfg.enable:
            return None
        return cls(
            recipe=cfg.recipe,
            fsdp_float8_all_gather=cfg.fsdp_float8_all_gather,
            precompute_scales=cfg.precompute_scales,
            filter_fqns=tuple(cfg.filter_fqns),
            model_exclude=tuple(model_exclude),
        )

    @property
    def tensorwise_backward(self) -> bool:
        """Whether the linears run our tensorwise backward (torchtitan/float8/matmul.py)."""
        return self.own_backward and self.recipe == "tensorwise"

    @property
    def rowwise_backward(self) -> bool:
        """Whether the linears run our rowwise backward (torchtitan/float8/rowwise_matmul.py);
        rowwise_with_gw_hp runs torchao's."""
        return self.own_backward and self.recipe == "rowwise"

    @property
    def scales_tp_shards(self) -> bool:
        """Whether each TP shard is scaled on its own (no amax all-reduce): tensorwise only."""
        return self.tp_shard_scales and self.recipe == "tensorwise"

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
        """Whether each weight shard is cast for FSDP's float8 all-gather by our one kernel: the
        trainer uses it wherever the scales are precomputed."""
        return (
            self.gathers_float8(fsdp_degree)
            and self.precompute_scales
            and self.one_kernel_all_gather_cast
        )


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
        if shape_skip_reason(fqn, k, n, setting, setting.model_exclude) is None:
            converted.add(name)
    return frozenset(converted)
