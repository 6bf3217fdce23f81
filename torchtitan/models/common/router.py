"""Top-k token routing for a Mixture-of-Experts layer, with the two balancing mechanisms.

Auxiliary-loss-free balancing keeps a per-expert bias that shifts which experts are *chosen*
but never the weights a token's expert outputs are mixed with; the bias itself is updated
between steps by ``load_balance.update_expert_biases`` from the counts kept here. The
optional sequence-level auxiliary loss rides on the autograd graph through ``AttachAuxLoss``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from torchtitan.models.common.moe import MoEArgs


class AttachAuxLoss(torch.autograd.Function):
    """Identity on ``out`` whose backward also feeds ``weight`` as the gradient of ``aux_loss``.

    This puts the auxiliary loss into the backward pass without adding it to any scalar loss,
    so it also trains the router on pipeline stages that never see the loss."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux_loss: torch.Tensor, weight: float) -> torch.Tensor:
        ctx.weight = weight
        ctx.aux_meta = (aux_loss.dtype, aux_loss.device)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        dtype, device = ctx.aux_meta
        return grad_out, torch.full((), ctx.weight, dtype=dtype, device=device), None


def sequence_aux_loss(scores: torch.Tensor, experts: torch.Tensor, coeff: float) -> torch.Tensor:
    """Sequence-level balance loss: ``coeff`` x mean over sequences of ``sum_i f_i P_i``.

    ``scores``: (bs, seq, E) fp32 router scores; ``experts``: (bs, seq, K) chosen experts.
    ``f_i`` is expert i's share of the sequence's assignments scaled so uniform routing gives
    1; ``P_i`` the sequence-mean of the scores normalised over all experts."""
    bs, seq, top_k = experts.shape
    num_experts = scores.shape[-1]
    counts = torch.zeros(bs, num_experts, dtype=scores.dtype, device=scores.device)
    counts.scatter_add_(
        1, experts.reshape(bs, -1), torch.ones_like(experts, dtype=scores.dtype).reshape(bs, -1)
    )
    load = counts * (num_experts / (top_k * seq))
    probs = (scores / scores.sum(dim=-1, keepdim=True)).mean(dim=1)
    return coeff * (load * probs).sum(dim=-1).mean()


def _recomputing() -> bool:
    """True inside the backward pass, i.e. while activation checkpointing re-runs a forward:
    then the statistics were already counted once. (Compiled graphs recompute inside the
    graph, where the buffer updates are not replayed, so there is nothing to check.)"""
    if torch.compiler.is_compiling():
        return False
    return torch._C._current_graph_task_id() != -1


def _limit_to_top_groups(select: torch.Tensor, num_groups: int, top_groups: int) -> torch.Tensor:
    """``select`` (N, E) with every expert outside each token's ``top_groups`` best groups set
    to -inf; a group's score is the sum of its two highest selection scores."""
    grouped = select.unflatten(-1, (num_groups, -1))
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    kept = torch.topk(group_scores, top_groups, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(-1, kept, True)
    return grouped.masked_fill(~keep[..., None], float("-inf")).flatten(-2)


class Router(nn.Module):
    """Scores every expert for every token and picks the top-k.

    Returns the routing weights (N, K) in the input dtype, the chosen experts (N, K) int64
    and the fp32 scores (N, E). Routing math runs in fp32 whatever the input dtype."""

    def __init__(self, dim: int, args: MoEArgs):
        super().__init__()
        self.args = args
        n = args.num_experts
        self.gate = nn.Linear(dim, n, bias=False)
        self.register_buffer("expert_bias", torch.zeros(n, dtype=torch.float32), persistent=True)
        self.register_buffer(
            "tokens_per_expert", torch.zeros(n, dtype=torch.float32), persistent=False
        )
        self.register_buffer("aux_loss_sum", torch.zeros((), dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = self.args
        logits = self.gate(x).float()
        if a.score_func == "softmax":
            scores = torch.softmax(logits, dim=-1)
        else:
            scores = torch.sigmoid(logits)
        # The bias only steers selection; the weights are read from the unbiased scores.
        select = scores + self.expert_bias if a.balance_bias else scores
        if a.num_groups > 1:
            select = _limit_to_top_groups(select, a.num_groups, a.top_groups)
        experts = torch.topk(select, a.top_k, dim=-1).indices
        weights = scores.gather(-1, experts)
        if a.normalize_scores:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if a.route_scale != 1.0:
            weights = weights * a.route_scale
        return weights.to(x.dtype), experts, scores

    @torch.no_grad()
    def record(self, experts: torch.Tensor, aux_loss: torch.Tensor | None) -> None:
        """Add this forward's expert choices (and aux loss) to the running statistics."""
        if _recomputing():
            return
        flat = experts.reshape(-1)
        ones = torch.ones_like(flat, dtype=self.tokens_per_expert.dtype)
        self.tokens_per_expert.scatter_add_(0, flat, ones)
        if aux_loss is not None:
            self.aux_loss_sum.add_(aux_loss.detach().float())

    @torch.no_grad()
    def reset_stats(self) -> None:
        self.tokens_per_expert.zero_()
        self.aux_loss_sum.zero_()
