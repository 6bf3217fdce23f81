"""Float8 training of a model's linears through torchao (the optional ``float8`` extra).

``apply_float8`` swaps eligible ``nn.Linear`` modules for torchao's ``Float8Linear`` on the
meta-device model, before TP and FSDP: the parameters keep their names, shapes and dtypes (torchao
keeps high-precision master weights and casts them to float8 inside each matmul), so TP plans,
FSDP, checkpoints and the HF export see the same model. Only the matmul inputs are float8:
e4m3 for activations and weights, e5m2 (tensorwise) or e4m3 (rowwise) for output gradients.

What follows from the recipe:

* tensorwise: one scale per tensor, the fastest kernels. FSDP2 can all-gather the weights in
  float8 (``fsdp_float8_all_gather``; the weight's amax is all-reduced over the shards, so the
  scale is the whole weight's). ``precompute_float8_scales`` then computes every weight's scale
  with one all-reduce per step. The linears run our backward (``matmul.py``); under TP each
  rank scales its own shards (``tp.py``).
* rowwise: one scale per row, our backward (``rowwise_matmul.py``); rowwise_with_gw_hp: torchao's.
  TP and FSDP move high-precision tensors.

Everything torchao-specific is imported lazily: without ``--float8.enable`` torchao is not needed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import sys
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from torchtitan.config import ConfigError, Float8

logger = logging.getLogger("torchtitan")

INSTALL_HINT = 'pip install -e ".[float8]"'
MIN_CAPABILITY = (8, 9)
FLOAT8_CARDS = "H100/H200/L40S/RTX 4090"


# --------------------------------------------------------------------------- torchao


@contextlib.contextmanager
def _quiet(*logger_names: str):
    """Raise these loggers to ERROR for a while: torchao's import warns about every CUDA
    extension a CPU build of torch cannot load, and about a deprecated pytree registration."""
    loggers = [logging.getLogger(name) for name in logger_names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def import_torchao_float8():
    """``torchao.float8``, or a one-line ``ConfigError`` that names the extra to install."""
    try:
        with _quiet("torchao", "torch.utils._pytree"):
            import torchao.float8
    except ImportError as e:
        raise ConfigError(f"--float8.enable needs torchao ({e}); {INSTALL_HINT}") from None
    return torchao.float8


def is_float8_linear(module: nn.Module) -> bool:
    if not isinstance(module, nn.Linear):
        return False
    from torchao.float8.float8_linear import Float8Linear

    return isinstance(module, Float8Linear)


def float8_linear_config(cfg: Float8, fsdp_sharded: bool):
    """torchao's ``Float8LinearConfig`` for the recipe; float8 all-gather only where FSDP shards."""
    ao = import_torchao_float8()
    base = ao.Float8LinearConfig.from_recipe_name(cfg.recipe)
    return dataclasses.replace(
        base,
        enable_fsdp_float8_all_gather=cfg.fsdp_float8_all_gather and fsdp_sharded,
        emulate=cfg.emulate,
    )


# --------------------------------------------------------------------------- which linears


def skip_reason(
    fqn: str, linear: nn.Linear, cfg: Float8, model_exclude: Iterable[str] = ()
) -> str | None:
    """Why ``linear`` stays in high precision, or None to convert it."""
    reason = shape_skip_reason(fqn, linear.in_features, linear.out_features, cfg, model_exclude)
    if reason is None and type(linear) is not nn.Linear:
        return f"a {type(linear).__name__}, not a plain nn.Linear"
    return reason


def shape_skip_reason(
    fqn: str, k: int, n: int, cfg: Float8, model_exclude: Iterable[str] = ()
) -> str | None:
    """The rule on a ``k -> n`` linear's name and shape alone (what the planner can know):
    excluded by the model family (``model_exclude``) or by ``--float8.filter_fqns``, or a
    shape the float8 matmul cannot take."""
    if any(name in fqn for name in model_exclude):
        return "the model keeps it"
    if any(name in fqn for name in cfg.filter_fqns):
        return "filter_fqns"
    if k % 16 or n % 16:
        return f"{k}->{n}: dims not divisible by 16"
    return None


def _pattern(fqn: str) -> str:
    """``layers.3.attention.wk`` -> ``layers.*.attention.wk``: one name for every block."""
    return re.sub(r"(^|\.)\d+(?=\.)", r"\1*", fqn)


@dataclasses.dataclass
class Float8Conversion:
    """Which linears ``apply_float8`` converted and why the others were kept."""

    converted: list[str]
    skipped: dict[str, str]  # FQN -> reason
    tiled: list[str] = dataclasses.field(default_factory=list)  # our backward, tiled input cast
    fused_all_gather_casts: int = 0  # weights cast for FSDP's float8 all-gather by our kernel
    rowwise_backward: int = 0  # linears running our rowwise backward

    def summary(self, cfg: Float8) -> str:
        kept: dict[str, str] = {}
        for fqn, reason in self.skipped.items():
            kept.setdefault(_pattern(fqn), reason)
        listing = ", ".join(f"{name} ({reason})" for name, reason in kept.items()) or "none"
        mode = f"{cfg.recipe}{', emulated' if cfg.emulate else ''}"
        line = (
            f"float8 ({mode}): {len(self.converted)} linears converted; kept in high "
            f"precision: {listing}"
        )
        if runs_tensorwise_backward(cfg):
            tiled = ", ".join(dict.fromkeys(map(_pattern, self.tiled))) or "none"
            line += f"; our tensorwise backward, input cast tiled in: {tiled}"
        if self.rowwise_backward:
            line += (
                f"; our rowwise backward in {self.rowwise_backward} linears (output gradients "
                "and inputs cast column-wise in a kernel of our own)"
            )
        if self.fused_all_gather_casts:
            line += (
                f"; {self.fused_all_gather_casts} weights cast for FSDP's float8 all-gather in "
                "one kernel"
            )
        return line


def apply_float8(
    model: nn.Module,
    cfg: Float8,
    fsdp_sharded: bool = False,
    model_exclude: Iterable[str] = (),
    tiled_cast: Iterable[str] = (),
) -> Float8Conversion:
    """Swap the eligible linears of ``model`` for ``Float8Linear`` in place; log one summary.

    Call it on the meta-device model before TP and FSDP (``fsdp_sharded``: whether FSDP will
    shard the weights, which turns on float8 all-gather if configured). The model family names
    the linears it keeps in high precision (``model_exclude``) and those whose input is cast in
    a tiled kernel (``tiled_cast``). Graphs compiled from then on recompute our casts in the
    backward (``recompute.py``).
    """
    ao = import_torchao_float8()
    skipped: dict[str, str] = {}
    converted: list[str] = []

    def keep_or_convert(module: nn.Module, fqn: str) -> bool:
        reason = skip_reason(fqn, module, cfg, model_exclude)
        if reason is None:
            converted.append(fqn)
        else:
            skipped[fqn] = reason
        return reason is None

    ao.convert_to_float8_training(
        model,
        module_filter_fn=keep_or_convert,
        config=float8_linear_config(cfg, fsdp_sharded),
    )
    from torchtitan.float8.recompute import recompute_float8_casts_in_backward

    recompute_float8_casts_in_backward()
    tiled, rowwise = [], 0
    if runs_tensorwise_backward(cfg):
        tiled = use_own_backward(model, tiled_cast)
    if runs_rowwise_backward(cfg):
        rowwise = use_rowwise_backward(model)
    fused = 0
    if casts_all_gather_in_one_kernel(cfg):
        from torchtitan.float8.all_gather import use_fused_all_gather_cast

        fused = use_fused_all_gather_cast(model)
    conversion = Float8Conversion(converted, skipped, tiled, fused, rowwise)
    logger.info(conversion.summary(cfg))
    if not converted:
        logger.warning(
            "float8: no linear was converted, nothing runs in float8 (see --float8.filter_fqns)"
        )
    return conversion


def runs_tensorwise_backward(cfg: Float8) -> bool:
    """Whether the linears run our tensorwise backward (matmul.py): the ``tensorwise`` recipe
    (the planner reads the same rule)."""
    return cfg.recipe == "tensorwise"


def runs_rowwise_backward(cfg: Float8) -> bool:
    """Whether the linears run our rowwise backward (rowwise_matmul.py): the ``rowwise`` recipe
    (the planner reads the same rule)."""
    return cfg.recipe == "rowwise"


def casts_all_gather_in_one_kernel(cfg: Float8) -> bool:
    """Whether FSDP's float8 all-gather casts each weight shard in our one kernel: with
    precomputed scales (the planner reads the same rule)."""
    return cfg.precompute_scales


def use_own_backward(model: nn.Module, tiled_cast_fqns: Iterable[str]) -> list[str]:
    """Make ``model``'s float8 linears run our tensorwise backward (matmul.py), the
    input cast tiled in those whose FQN contains one of ``tiled_cast_fqns``; returns their FQNs."""
    from torchao.float8.float8_linear import Float8Linear

    from torchtitan.float8.matmul import Float8TensorwiseLinear

    tiled = []
    for fqn, module in model.named_modules():
        if type(module) is Float8Linear:
            module.__class__ = Float8TensorwiseLinear
            module.tiled_input_cast = any(name in fqn for name in tiled_cast_fqns)
            if module.tiled_input_cast:
                tiled.append(fqn)
    return tiled


def use_rowwise_backward(model: nn.Module) -> int:
    """Make ``model``'s rowwise float8 linears run our rowwise backward
    (rowwise_matmul.py); returns how many."""
    from torchao.float8.float8_linear import Float8Linear

    from torchtitan.float8.rowwise_matmul import Float8RowwiseLinear, is_rowwise

    changed = 0
    for module in model.modules():
        if type(module) is Float8Linear and is_rowwise(module.config):
            module.__class__ = Float8RowwiseLinear
            changed += 1
    return changed


# --------------------------------------------------------------------------- FSDP and checkpoints


def precompute_float8_scales(model_parts: Iterable[nn.Module], cfg: Float8) -> None:
    """Compute the float8 scale of every FSDP-sharded weight with one fused all-reduce.

    Called right before each step's forward (the weights changed in the last optimizer step, or
    were just loaded), so the first step and a resumed step use the same scales as any other.
    Without it, each weight's all-gather computes its own amax all-reduce (same values).
    """
    if not (cfg.enable and cfg.precompute_scales):
        return
    ao = import_torchao_float8()
    for part in model_parts:
        ao.precompute_float8_dynamic_scale_for_fsdp(part)


def plain_weights(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (a model state dict) with each weight of FSDP's float8 all-gather (torchao's
    ``WeightWithDynamicFloat8CastTensor``, inside a DTensor) replaced by the high-precision
    tensor it wraps, sharing its storage. DCP pickles a tensor's class with its data, so without
    this a checkpoint would need torchao to load; with it, float8 and plain runs read each
    other's checkpoints, and loading into the shared storage loads the weight."""
    if "torchao.float8" not in sys.modules:
        return state
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    def plain(value):
        if not isinstance(value, DTensor):
            return value
        local = value.to_local()
        if not isinstance(local, WeightWithDynamicFloat8CastTensor):
            return value
        return DTensor.from_local(
            local._tensor,
            value.device_mesh,
            value.placements,
            run_check=False,
            shape=value.shape,
            stride=value.stride(),
        )

    return {key: plain(value) for key, value in state.items()}


# --------------------------------------------------------------------------- device checks


def float8_device_problem(
    cfg: Float8, cuda: bool, device_name: str = "", capability: tuple[int, int] = (0, 0)
) -> str | None:
    """A one-line reason why float8 cannot run on this device, or None."""
    if not cfg.enable or cfg.emulate:
        return None
    if not cuda:
        return "--float8.enable on CPU needs --float8.emulate (no float8 tensor cores)"
    if tuple(capability) < MIN_CAPABILITY:
        major, minor = capability
        return (
            f"float8 needs compute capability >= 8.9 ({FLOAT8_CARDS}); {device_name} is "
            f"{major}.{minor}; add --float8.emulate (slow) or drop --float8.enable"
        )
    return None


def recompute_must_round_like_forward(
    cfg: Float8, compiled: bool, ac_mode: str, ac_option: str
) -> bool:
    """Whether this run needs inductor to round low-precision intermediates exactly as eager
    does (``emulate_precision_casts``): rowwise float8, compiled, under the selective-op policy.

    Without it the compiled forward and the backward's recompute of a block round bf16
    intermediates differently, so the K and V the attention backward recomputes differ from the
    forward's (whose output and logsumexp were saved): the gradients blow up (8B FSDP4 on H200:
    grad norm 1.4e5 at step 1; pytorch/pytorch#150859). Full and every-N-th-block checkpointing
    recompute the attention too, so they should stay consistent (reasoning: rowwise with them
    was not run at 8B on a GPU; the reference sets it under any AC); tensorwise trained normally.
    """
    rowwise = cfg.enable and cfg.recipe != "tensorwise"
    return rowwise and compiled and ac_mode == "selective" and ac_option == "op"


def round_recompute_like_forward() -> None:
    """Process-wide: every graph compiled from now on rounds like eager (slightly slower)."""
    import torch._inductor.config as inductor_config

    inductor_config.emulate_precision_casts = True
    logger.info(
        "float8 rowwise + compile + selective-op AC: inductor rounds bf16 intermediates like "
        "eager (emulate_precision_casts), so the recompute matches the forward"
    )


def check_float8(cfg: Float8) -> None:
    """Preflight: torchao importable and a device that runs float8; one-line ``ConfigError``."""
    if not cfg.enable:
        return
    import_torchao_float8()
    if torch.version.hip is not None:  # ROCm: torchao picks its float8 types per card
        return
    cuda = torch.cuda.is_available()
    name, capability = "", (0, 0)
    if cuda:
        name, capability = torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0)
    problem = float8_device_problem(cfg, cuda, name, capability)
    if problem:
        raise ConfigError(problem)
