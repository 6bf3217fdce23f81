"""The joint-graph pass that recomputes our float8 casts in the backward
(torchtitan/float8/recompute.py): which nodes it marks, how it installs, and what the
compiled AC-off block would keep without it."""

from __future__ import annotations

import dataclasses
import operator

import pytest
import torch
import torch._inductor.config as inductor_config
from torch.utils.checkpoint import CheckpointPolicy

from tests.unit.test_float8_backward import EMULATED, saved_for_backward
from torchtitan.float8 import recompute as float8_recompute
from torchtitan.float8.convert import import_torchao_float8
from torchtitan.float8.recompute import (
    RecomputeFloat8Casts,
    recompute_float8_casts_in_backward,
)

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _restore_the_inductor_pass(monkeypatch):
    import_torchao_float8()  # the cast operators' modules need torchao
    monkeypatch.setattr(inductor_config, "joint_custom_pre_pass", None)


def joint_graph() -> tuple[torch.fx.Graph, dict[str, torch.fx.Node]]:
    """A joint graph in miniature: a norm-like output cast (through a view), an attention-like
    output (an item of a multi-output op) cast, a cast a checkpoint policy marked, and an output
    gradient's cast."""
    cast = float8_recompute._cast_operators()[0]  # float8_cast_transposed, registered
    g = torch.fx.Graph()
    x, scale, grad = (
        g.placeholder("primals_1"),
        g.placeholder("primals_2"),
        g.placeholder("tangents_1"),
    )
    n = {"normed": g.call_function(aten.mul.Tensor, (x, x))}
    n["forward cast"] = g.call_function(
        cast,
        (g.call_function(aten.view.default, (n["normed"], [-1, 8])), scale, torch.float8_e4m3fn),
    )
    pair = g.call_function(aten.split.Tensor, (x, 4))
    n["item"] = g.call_function(operator.getitem, (pair, 0))
    n["item cast"] = g.call_function(cast, (n["item"], scale, torch.float8_e4m3fn))
    n["kept"] = g.call_function(aten.add.Tensor, (x, x))
    n["kept"].meta["recompute"] = CheckpointPolicy.MUST_SAVE
    n["policy cast"] = g.call_function(cast, (n["kept"], scale, torch.float8_e4m3fn))
    n["gradient"] = g.call_function(aten.mul.Tensor, (grad, x))
    n["gradient cast"] = g.call_function(cast, (n["gradient"], scale, torch.float8_e4m3fn))
    g.output(tuple(n.values()))
    return g, n


def test_marks_the_forward_casts_and_their_recomputable_inputs_only():
    graph, nodes = joint_graph()
    RecomputeFloat8Casts()(graph)
    marks = {name: node.meta.get("recompute") for name, node in nodes.items()}
    assert marks == {
        "normed": CheckpointPolicy.PREFER_RECOMPUTE,  # through the view
        "forward cast": CheckpointPolicy.PREFER_RECOMPUTE,
        "item": None,  # its op may not be recomputed
        "item cast": CheckpointPolicy.PREFER_RECOMPUTE,
        "kept": CheckpointPolicy.MUST_SAVE,  # a policy's mark stays
        "policy cast": CheckpointPolicy.PREFER_RECOMPUTE,
        "gradient": None,  # the backward's own
        "gradient cast": None,
    }


def test_installs_once_and_keeps_a_pass_set_before(monkeypatch):
    seen = []
    monkeypatch.setattr(inductor_config, "joint_custom_pre_pass", seen.append)
    recompute_float8_casts_in_backward()
    recompute_float8_casts_in_backward()
    installed = inductor_config.joint_custom_pre_pass
    assert isinstance(installed, RecomputeFloat8Casts) and installed.then == seen.append
    graph, _ = joint_graph()
    installed(graph)
    assert seen == [graph]
    assert installed.uuid() != RecomputeFloat8Casts().uuid()  # inductor's cache tells them apart


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_without_the_pass_the_ac_off_block_keeps_more(monkeypatch, recipe):
    """What the pass saves, on the debug model's block (512 tokens x 256, 768 hidden), no AC:
    without it the partitioner keeps the tensorwise norm outputs' float8 casts (1 byte per
    element of both norm outputs), and for rowwise the casts' bf16 inputs (2 bytes each)."""
    cfg = dataclasses.replace(EMULATED, recipe=recipe)
    op = "float8_cast_transposed" if recipe == "tensorwise" else "float8_cast_columnwise"
    with_pass = saved_for_backward(cfg, "none", op=op)
    monkeypatch.setattr(inductor_config, "joint_custom_pre_pass", None)
    monkeypatch.setattr(float8_recompute, "recompute_float8_casts_in_backward", lambda: None)
    without = saved_for_backward(cfg, "none", op=op)
    norm_outputs = 2 * 512 * 256
    if recipe == "tensorwise":
        assert (without["forward casts"], without["backward casts"]) == (2, 0)
        assert 0 <= without["saved"] - with_pass["saved"] - norm_outputs <= 64
    else:
        assert without["saved"] - with_pass["saved"] >= 2 * norm_outputs
