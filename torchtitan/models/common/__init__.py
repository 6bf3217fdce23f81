"""What every model family shares: its declaration (``ModelFamily``) and the Mixture-of-Experts
layer (``MoE``, ``MoEArgs``). The load-balancing helpers live in ``load_balance`` (imported
directly: it needs torch.distributed)."""

from torchtitan.models.common.family import ModelFamily
from torchtitan.models.common.moe import GroupedExperts, MoE, MoEArgs, SwiGLU
from torchtitan.models.common.router import Router

__all__ = ["GroupedExperts", "ModelFamily", "MoE", "MoEArgs", "Router", "SwiGLU"]
