"""A graph rewrite that lets inductor's async-TP pass fuse the sequence all-gathers at local
batch 1.

Sequence parallelism gathers a ``[B, S/tp, D]`` shard along the sequence. At local batch 1 the
traced graph reaches each matmul through two reshapes: the gathered stack ``[tp, S/tp, D]`` is
reshaped to ``[1, S, D]`` and then flattened to ``[S, D]`` for the linear. Inductor's
micro-pipeline pass follows only one reshape between the all-gather and ``mm`` (and expects the
matmul's output reshaped back to the gathered stack's leading shape), so it left both all-gathers
of every block unfused (docs/performance.md, finding 8). This pass runs before it and rewrites

    wait(all_gather(x)) -> reshape [1, S, D] -> reshape [S, D] -> mm -> reshape [1, S, N]

into

    wait(all_gather(x)) -> reshape [S, D] -> mm -> reshape [tp, S/tp, N] -> reshape [1, S, N]

Same elements in the same order, the same matmul: only views change. Plain ``mm`` only: Float8's
``_scaled_mm`` chains are left as they are (not measured with this rewrite).
"""

from __future__ import annotations

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

aten = torch.ops.aten
c10d = torch.ops._c10d_functional


def _is(node: object, target: object) -> bool:
    return isinstance(node, torch.fx.Node) and node.target is target


def _gathered_stacks(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The ``wait_tensor`` nodes that hold an all-gather's result."""
    return [
        node
        for node in graph.find_nodes(op="call_function", target=c10d.wait_tensor.default)
        if _is(node.args[0], c10d.all_gather_into_tensor.default)
    ]


def _reshape(graph: torch.fx.Graph, source: torch.fx.Node, shape: list[int]) -> torch.fx.Node:
    node = graph.call_function(aten.reshape.default, (source, shape))
    node.meta["val"] = source.meta["val"].reshape(shape)
    return node


def _reshape_outputs_to_stack(mm: torch.fx.Node, stack_shape: list[int]) -> None:
    """Route each reshape of ``mm``'s output through the gathered stack's leading shape."""
    graph = mm.graph
    out_shape = [*stack_shape[:-1], mm.meta["val"].shape[-1]]
    for user in list(mm.users):
        if _is(user, aten.reshape.default) and list(user.meta["val"].shape) != out_shape:
            with graph.inserting_before(user):
                via_stack = _reshape(graph, mm, out_shape)
            user.replace_input_with(mm, via_stack)


def collapse_reshapes_after_all_gather(graph: torch.fx.Graph) -> int:
    """Rewrite every ``all-gather -> reshape -> reshape -> matmul`` chain (see the module
    docstring); -> how many flattening reshapes now read the gathered stack directly."""
    rewritten = 0
    for stack in _gathered_stacks(graph):
        stack_shape = list(stack.meta["val"].shape)
        for outer in [u for u in stack.users if _is(u, aten.reshape.default)]:
            for inner in [u for u in outer.users if _is(u, aten.reshape.default)]:
                matmuls = [
                    u for u in inner.users if u.target is aten.mm.default and u.args[0] is inner
                ]
                if not matmuls:
                    continue
                inner.replace_input_with(outer, stack)
                for mm in matmuls:
                    _reshape_outputs_to_stack(mm, stack_shape)
                rewritten += 1
            if not outer.users:
                graph.erase_node(outer)
    return rewritten


class CollapseReshapesAfterAllGather(CustomGraphPass):
    """The rewrite as an inductor post-grad pre-pass; its uuid keys inductor's graph cache to
    this file's contents."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        collapse_reshapes_after_all_gather(graph)

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))
