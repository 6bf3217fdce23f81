"""Our float8 weight-gradient casts run in the compiled backward, recomputed, never kept.

The weight-gradient matmul of our float8 backwards takes its input cast by an operator of ours
(``torchtitan::float8_cast_transposed``, tensorwise; ``torchtitan::float8_cast_columnwise``,
rowwise), called in the backward on an input the forward computed. Compiled, the partitioner
decides where it runs: it recomputes in the backward only the ops on its allowlist (aten's
pointwise ops, views...), so without activation checkpointing it would run our operator in the
forward and keep its float8 result (tensorwise: 2 x dim bytes per token per block, 2 GiB at 8B,
seq 8192), or keep the operator's bf16 input (rowwise). Under checkpointing, the policy marks it
for recompute and it runs in the backward (docs/performance.md).

``recompute_float8_casts_in_backward`` installs a joint-graph pass (inductor's
``joint_custom_pre_pass``) that marks the operator as a checkpoint policy marks an op to recompute
(``PREFER_RECOMPUTE``) where no policy has marked it, and the op computing its input too when that
op is one the partitioner may recompute (a norm's output, the SwiGLU product; not attention's
output): the partitioner would otherwise keep that input in bf16, since an operator it cannot fuse
reads it in the backward. It then runs both in the backward and recomputes the input from what it
keeps anyway (the residual stream and the norm's scale; the SwiGLU's two inputs), as it does for
torchao's casts, which inductor fuses into that recomputation. Nodes a checkpoint policy already
marked keep their mark.
"""

from __future__ import annotations

import operator

import torch
from torch._functorch.partitioners import get_default_op_list
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch.utils.checkpoint import CheckpointPolicy


def _cast_operators() -> tuple:
    # Importing the modules registers the operators.
    from torchtitan.float8 import rowwise_matmul, transposed_cast  # noqa: F401

    ops = torch.ops.torchtitan
    return (ops.float8_cast_transposed.default, ops.float8_cast_columnwise.default)


def _producer(node: torch.fx.Node, op_types) -> torch.fx.Node | None:
    """The op computing ``node``'s input tensor, through views; None when not a node."""
    source = node.args[0]
    while isinstance(source, torch.fx.Node) and op_types.is_view(source):
        source = source.args[0]
    return source if isinstance(source, torch.fx.Node) else None


def _nodes_of_the_backward(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The joint graph's nodes computed from the output gradients (the partitioner's tangents):
    their casts (the output gradients') run in the backward anyway."""
    found: set[torch.fx.Node] = set()
    for node in graph.nodes:
        is_tangent = node.op == "placeholder" and "tangents" in str(node.target)
        if is_tangent or any(i in found for i in node.all_input_nodes):
            found.add(node)
    return found


def _recomputable(node: torch.fx.Node, op_types) -> bool:
    """An aten op the partitioner may recompute; not an item of a multi-output op (attention's
    output), whose op it may not."""
    return (
        node.op == "call_function"
        and node.target is not operator.getitem
        and op_types.is_fusible(node)
    )


def _mark_for_recompute(node: torch.fx.Node) -> None:
    node.meta.setdefault("recompute", CheckpointPolicy.PREFER_RECOMPUTE)


class RecomputeFloat8Casts(CustomGraphPass):
    """Marks our cast operators' unmarked nodes, and their inputs' unmarked producers the
    partitioner may recompute, ``PREFER_RECOMPUTE``; then runs ``then`` (a pass installed before
    this one), if any."""

    def __init__(self, then=None):
        self.then = then

    def __call__(self, graph: torch.fx.Graph) -> None:
        casts = _cast_operators()
        op_types = get_default_op_list()
        backward = _nodes_of_the_backward(graph)
        for node in graph.nodes:
            if node.op != "call_function" or node.target not in casts or node in backward:
                continue
            _mark_for_recompute(node)
            producer = _producer(node, op_types)
            if producer is not None and _recomputable(producer, op_types):
                _mark_for_recompute(producer)
        if self.then is not None:
            self.then(graph)

    def uuid(self) -> bytes:
        # Inductor's cache key: this file's text, and the chained pass's own key.
        then = self.then.uuid() if isinstance(self.then, CustomGraphPass) else repr(self.then)
        return get_hash_for_files((__file__,), extra=str(then))


def recompute_float8_casts_in_backward() -> None:
    """Process-wide, once: graphs compiled from now on recompute our float8 casts in the backward
    (a pass set before is kept and runs after ours)."""
    import torch._inductor.config as inductor_config

    current = inductor_config.joint_custom_pre_pass
    if not isinstance(current, RecomputeFloat8Casts):
        inductor_config.joint_custom_pre_pass = RecomputeFloat8Casts(then=current)
