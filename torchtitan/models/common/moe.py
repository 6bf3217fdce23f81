"""A dropless Mixture-of-Experts feed-forward layer that any model family can use.

Every token reaches all of its top-k experts (no capacity factor). The (token, expert) pairs
are sorted by expert so each expert's tokens are contiguous, the SwiGLU experts run as grouped
GEMMs over those contiguous groups, and the weighted outputs are added back per token.

``torch._grouped_mm`` (torch 2.13): on CPU it runs eagerly for fp32, fp16 and bf16 with a 2-D
token matrix against 3-D (E, K, N) weights, takes transposed weight views and empty groups,
but wants int32 ``offs`` and every leading stride a multiple of 16 bytes (rows past ``offs[-1]``
are left unwritten). Under ``torch.compile`` its fake-tensor rule accepts bf16 only: bf16
compiles with ``fullgraph=True`` (forward and backward), fp32 fails to trace. On CUDA (not run
here) non-bf16 inputs reportedly take a per-group fallback that reads ``offs`` on the host.
So the automatic choice uses grouped GEMMs for bf16, and for other dtypes only eagerly on CPU.
Otherwise, eagerly, it loops over experts, which reads the group sizes on the host (one sync);
under compile (a block compiles as one graph) every expert runs on every row and each row
keeps its own expert's result: E / k times the FLOPs, for fp32 debug runs, with no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from torchtitan.models.common.router import AttachAuxLoss, Router, sequence_aux_loss

SCORE_FUNCS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class MoEArgs:
    num_experts: int
    top_k: int
    hidden_dim: int  # each routed expert's SwiGLU hidden size
    # Shared experts: one SwiGLU of hidden num_shared_experts * hidden_dim that every token passes.
    num_shared_experts: int = 0
    # "softmax" over all experts (Qwen3-MoE) or "sigmoid" per expert (DeepSeek-V3).
    score_func: str = "softmax"
    normalize_scores: bool = True  # renormalise the chosen top-k weights to sum to 1
    route_scale: float = 1.0  # multiplies the routing weights
    # Group-limited routing (DeepSeek): experts split into num_groups equal groups, each token
    # chooses among the experts of its top_groups groups only (a group scores the sum of its two
    # best experts). 1 group: plain top-k.
    num_groups: int = 1
    top_groups: int = 1
    # Auxiliary-loss-free balancing: a per-expert bias added to the scores for selection only.
    balance_bias: bool = True
    bias_update_rate: float = 1e-3
    aux_loss_coeff: float = 0.0  # sequence-level auxiliary balance loss; 0 = off

    def validate(self) -> None:
        """Raise ValueError, one actionable line, on an inconsistent combination."""
        for name in ("num_experts", "top_k", "hidden_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"moe {name} must be positive, got {getattr(self, name)}")
        if self.top_k > self.num_experts:
            raise ValueError(
                f"moe top_k {self.top_k} is larger than num_experts {self.num_experts}"
            )
        if self.num_shared_experts < 0:
            raise ValueError(f"moe num_shared_experts must be >= 0, got {self.num_shared_experts}")
        if self.score_func not in SCORE_FUNCS:
            raise ValueError(
                f"moe score_func {self.score_func!r} is not one of {', '.join(SCORE_FUNCS)}"
            )
        if self.route_scale <= 0:
            raise ValueError(f"moe route_scale must be positive, got {self.route_scale}")
        for name in ("bias_update_rate", "aux_loss_coeff"):
            if getattr(self, name) < 0:
                raise ValueError(f"moe {name} must be >= 0, got {getattr(self, name)}")
        if self.num_groups > 1:
            self._validate_groups()

    def _validate_groups(self) -> None:
        groups, top = self.num_groups, self.top_groups
        if self.num_experts % groups or self.num_experts // groups < 2:
            raise ValueError(
                f"moe num_groups {groups} must divide num_experts {self.num_experts} into groups "
                "of at least 2 experts"
            )
        if not 1 <= top <= groups:
            raise ValueError(f"moe top_groups must be in [1, num_groups={groups}], got {top}")
        if self.top_k > top * (self.num_experts // groups):
            raise ValueError(
                f"moe top_k {self.top_k} exceeds the experts of top_groups {top} groups "
                f"({top * (self.num_experts // groups)})"
            )

    def params(self, dim: int) -> tuple[int, int]:
        """(total, active per token) parameters of one layer, router gate and shared experts
        included."""
        expert = 3 * dim * self.hidden_dim
        always = dim * self.num_experts + 3 * dim * self.hidden_dim * self.num_shared_experts
        return always + self.num_experts * expert, always + self.top_k * expert

    def flops_per_token(self, dim: int) -> int:
        """Training FLOPs per token of one layer: 6 x the active matmul parameters."""
        return 6 * self.params(dim)[1]


def _trunc_normal(w: torch.Tensor, std: float) -> None:
    # In place, so it also works on DTensor parameters (each rank fills its own shard).
    nn.init.trunc_normal_(w, mean=0.0, std=std, a=-3 * std, b=3 * std)


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)``: the shared experts."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, init_std: float, out_std: float) -> None:
        _trunc_normal(self.w1.weight, init_std)
        _trunc_normal(self.w3.weight, init_std)
        _trunc_normal(self.w2.weight, out_std)


def grouped_mm_usable(x: torch.Tensor, dim: int, hidden_dim: int) -> bool:
    """Whether ``torch._grouped_mm`` takes these inputs without a host sync (module docstring)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    align = 16 // x.element_size()
    if dim % align or hidden_dim % align:
        return False
    if x.dtype == torch.bfloat16:
        return True
    eager_cpu = x.device.type == "cpu" and not torch.compiler.is_compiling()
    return eager_cpu and x.dtype in (torch.float32, torch.float16)


class GroupedExperts(nn.Module):
    """``num_experts`` SwiGLU experts stored as stacked weights (E, out, in).

    ``grouped``: True = grouped GEMMs, False = loop over experts, None = choose per call."""

    def __init__(self, dim: int, hidden_dim: int, num_experts: int, grouped: bool | None = None):
        super().__init__()
        self.dim, self.hidden_dim, self.grouped = dim, hidden_dim, grouped
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.init_weights(0.02, 0.02)

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``x``: (M, dim) rows sorted by expert; ``counts``: (E,) rows per expert, sum M."""
        grouped = self.grouped
        if grouped is None:
            grouped = grouped_mm_usable(x, self.dim, self.hidden_dim)
        w1, w2, w3 = (_local(w).to(x.dtype) for w in (self.w1, self.w2, self.w3))
        if grouped:
            return _grouped_swiglu(x, counts, w1, w2, w3)
        if torch.compiler.is_compiling():
            return _masked_swiglu(x, counts, w1, w2, w3)
        return _per_expert_swiglu(x, counts, w1, w2, w3)

    def init_weights(self, init_std: float, out_std: float) -> None:
        _trunc_normal(self.w1, init_std)
        _trunc_normal(self.w3, init_std)
        _trunc_normal(self.w2, out_std)


def _local(w: torch.Tensor) -> torch.Tensor:
    """This rank's experts: under expert parallelism the weights are DTensors split on the
    expert dimension (torchtitan.parallel.expert_parallel), which routes the rows to match."""
    return w.to_local() if hasattr(w, "to_local") else w


def _grouped_swiglu(x, counts, w1, w2, w3) -> torch.Tensor:
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
    # _grouped_mm multiplies by (E, in, out): the transposed views of the (E, out, in) weights.
    gate = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs)
    up = torch._grouped_mm(x, w3.transpose(-2, -1), offs=offs)
    return torch._grouped_mm(F.silu(gate) * up, w2.transpose(-2, -1), offs=offs)


def _masked_swiglu(x, counts, w1, w2, w3) -> torch.Tensor:
    """Every expert on every row, each row keeping its own expert's output (no host sync)."""
    num_experts = counts.shape[0]
    experts = torch.arange(num_experts, device=x.device)
    row_expert = torch.repeat_interleave(experts, counts, output_size=x.shape[0])
    out = torch.zeros_like(x)
    for e in range(num_experts):
        h = (F.silu(x @ w1[e].t()) * (x @ w3[e].t())) @ w2[e].t()
        out = torch.where((row_expert == e)[:, None], h, out)
    return out


def _per_expert_swiglu(x, counts, w1, w2, w3) -> torch.Tensor:
    outs = []
    for e, rows in enumerate(torch.split(x, counts.tolist())):
        h = F.silu(rows @ w1[e].t()) * (rows @ w3[e].t())
        outs.append(h @ w2[e].t())
    return torch.cat(outs)


class MoE(nn.Module):
    """Router + routed experts (+ shared experts): (bs, seq, dim) -> (bs, seq, dim).

    The k expert outputs of a token are scaled by its routing weights in the input dtype (as
    Qwen3-MoE does) and summed in fp32 (``index_add_``), so the sum is rounded once rather
    than after every expert; this costs one transient fp32 copy of the (tokens x k, dim) rows.
    ``aux_loss_weight`` is the gradient fed to the auxiliary loss (the trainer sets it to the
    step's loss normalisation)."""

    def __init__(self, dim: int, args: MoEArgs, grouped: bool | None = None):
        super().__init__()
        args.validate()
        self.args = args
        self.router = Router(dim, args)
        self.experts = GroupedExperts(dim, args.hidden_dim, args.num_experts, grouped)
        shared = args.num_shared_experts * args.hidden_dim
        self.shared_experts = SwiGLU(dim, shared) if shared else None
        self.aux_loss_weight = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seq, dim = x.shape
        a = self.args
        flat = x.reshape(-1, dim)
        weights, experts, scores = self.router(flat)
        aux_loss = None
        if self.training:
            if a.aux_loss_coeff > 0:
                aux_loss = sequence_aux_loss(
                    scores.view(bs, seq, -1), experts.view(bs, seq, -1), a.aux_loss_coeff
                )
            self.router.record(experts, aux_loss)

        # Stable sort by expert: each expert's rows contiguous, tokens in order within.
        order = torch.argsort(experts.reshape(-1), stable=True)
        token_idx = order // a.top_k
        counts = torch.zeros(a.num_experts, dtype=torch.int64, device=x.device)
        counts.scatter_add_(0, experts.reshape(-1), torch.ones_like(order))
        routed = self.experts(flat[token_idx], counts)
        routed = routed * weights.reshape(-1, 1)[order]
        out = torch.zeros(flat.shape, dtype=torch.float32, device=x.device)
        out.index_add_(0, token_idx, routed.float())
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat).float()
        out = out.to(x.dtype).view(bs, seq, dim)
        if aux_loss is not None:
            out = AttachAuxLoss.apply(out, aux_loss, self.aux_loss_weight)
        return out

    def init_weights(self, init_std: float, out_std: float) -> None:
        """Trunc-normal like the dense FFN (gate, w1, w3: ``init_std``; w2: ``out_std``);
        zeroes the balance bias and the statistics."""
        _trunc_normal(self.router.gate.weight, init_std)
        self.experts.init_weights(init_std, out_std)
        if self.shared_experts is not None:
            self.shared_experts.init_weights(init_std, out_std)
        with torch.no_grad():
            self.router.expert_bias.zero_()
        self.router.reset_stats()
