"""The decoupled RoPE of multi-head latent attention, with YaRN frequency scaling.

Only ``qk_rope_head_dim`` of each query/key head is rotated, in Meta's interleaved pairs
``(x[2i], x[2i+1])`` as DeepSeek's checkpoints expect (so their weights load unpermuted); the
rotation itself is Llama's (``torchtitan.models.llama3.model.apply_rope``). YaRN keeps the fast
frequencies, divides the slow ones by ``factor`` and ramps linearly in between; its attention
temperature scales the cached cos/sin (the rotated part of q and k) and the softmax scale (the
whole head).
"""

from __future__ import annotations

import math

import torch

from torchtitan.models.deepseek_v3.args import DeepSeekV3Args, YarnScaling


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context ``factor`` times longer: 0.1 m ln(f) + 1."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _correction_dim(rotations: float, dim: int, theta: float, context: int) -> float:
    """The (fractional) pair index whose wavelength fits ``rotations`` times into ``context``."""
    return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def rope_frequencies(dim: int, theta: float, yarn: YarnScaling | None) -> torch.Tensor:
    """Angular frequency of each of the dim // 2 rotated pairs (float64)."""
    freqs = theta ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if yarn is None:
        return freqs
    context = yarn.original_max_seq_len
    low = max(math.floor(_correction_dim(yarn.beta_fast, dim, theta, context)), 0)
    high = min(math.ceil(_correction_dim(yarn.beta_slow, dim, theta, context)), dim - 1)
    span = high - low if high != low else 0.001
    # 0 for the fast pairs (kept), 1 for the slow ones (interpolated: divided by the factor).
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / span).clamp(0.0, 1.0)
    return freqs / yarn.factor * ramp + freqs * (1 - ramp)


def rope_attention_factor(yarn: YarnScaling | None) -> float:
    """What YaRN multiplies the cached cos and sin by."""
    if yarn is None:
        return 1.0
    if yarn.mscale and yarn.mscale_all_dim:
        return yarn_mscale(yarn.factor, yarn.mscale) / yarn_mscale(yarn.factor, yarn.mscale_all_dim)
    return yarn_mscale(yarn.factor)


def softmax_scale(args: DeepSeekV3Args) -> float:
    """1 / sqrt(qk_head_dim), times YaRN's whole-head temperature squared when it has one."""
    scale = args.qk_head_dim**-0.5
    yarn = args.rope_scaling
    if yarn is not None and yarn.mscale_all_dim:
        scale *= yarn_mscale(yarn.factor, yarn.mscale_all_dim) ** 2
    return scale


def precompute_rope_cache(args: DeepSeekV3Args) -> torch.Tensor:
    """(max_seq_len, qk_rope_head_dim) float32: cat(cos, sin) of position x frequency, times
    YaRN's attention factor; position first so context parallelism can shard it."""
    freqs = rope_frequencies(args.qk_rope_head_dim, args.rope_theta, args.rope_scaling)
    angles = torch.outer(torch.arange(args.max_seq_len, dtype=torch.float64), freqs)
    factor = rope_attention_factor(args.rope_scaling)
    return (torch.cat([angles.cos(), angles.sin()], dim=-1) * factor).float()
