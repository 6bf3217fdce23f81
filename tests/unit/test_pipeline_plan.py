"""Stage planning, stage modules and schedule validation (no processes)."""

import inspect

import pytest
import torch
import torch.nn as nn

from torchtitan.models.llama3 import ModelArgs, Transformer, get_model_args
from torchtitan.models.llama3.parallelize import LLAMA3
from torchtitan.parallel.activation_checkpoint import apply_ac
from torchtitan.parallel.blocks import BlockOnAnotherStage, block_items
from torchtitan.parallel.fsdp import apply_fsdp
from torchtitan.parallel.pipeline import (
    balanced_split,
    build_stage_module,
    check_microbatches,
    head_units,
    plan_stages,
)


def sizes(split):
    return [len(stage) for stage in split]


def test_balanced_split_weighs_the_head():
    # A head of 1.2 blocks: 6 layers over 2 stages, the head's stage lighter (4 | 2 + 1.2)
    assert balanced_split(6, 2, head=1.2) == ((0, 1, 2, 3), (4, 5))
    # the old count (embedding and head one block each) is a choice of weights
    assert balanced_split(6, 2, head=1, embedding=1) == ((0, 1, 2), (3, 4, 5))
    # over 8 stages: the first holds only the embedding, the last only the head
    assert balanced_split(6, 8, head=1.2) == ((), (0,), (1,), (2,), (3,), (4,), (5,), ())


def test_balanced_split_evens_out_ranks_before_stages():
    """8B at seq 8192: the head is 2.09 blocks. Interleaved over 2 ranks (stages 0, 2 | 1, 3),
    8 | 9 | 8 | 7 + head left rank 1 with 17.1 blocks of work against rank 0's 16; 8 | 9 | 9 |
    6 + head gives 17 and 17.1, with no stage over 9."""
    interleaved = [0, 1, 0, 1]
    assert sizes(balanced_split(32, 4, head=2.09, ranks=interleaved)) == [8, 9, 9, 6]
    # one stage per rank: the busiest stage (9) is what counts; the fewest layers first
    assert sizes(balanced_split(32, 4, head=2.09)) == [8, 9, 9, 6]
    # V-shaped: rank 0 holds the first and the last stage (9 + 6 + head against 8 + 9)
    assert sizes(balanced_split(32, 4, head=2.09, ranks=[0, 1, 1, 0])) == [9, 8, 9, 6]
    # 1B (head 3.4 blocks) over 2 stages: 10 | 6 + head, not 8 | 8 + head
    assert sizes(balanced_split(16, 2, head=3.38)) == [10, 6]


def test_balanced_split_many_stages_stays_whole():
    split = balanced_split(128, 64, head=2.0, ranks=[s % 8 for s in range(64)])
    assert [layer for stage in split for layer in stage] == list(range(128))
    assert all(stage for stage in split[1:-1])


def test_head_units_from_the_model_shape():
    args = get_model_args("8B")
    assert head_units(args, 8192) == pytest.approx(
        6 * 4096 * 128256 / (6 * args.block_params() + 6 * 4096 * 8192)
    )
    assert head_units(args, 8192) == pytest.approx(2.087, abs=1e-3)
    assert head_units(args, 8192, "full") == pytest.approx(head_units(args, 8192) * 3 / 4)
    plan = plan_stages(32, 2, 0, "Interleaved1F1B", head_units=head_units(args, 8192))
    assert sizes(plan.layers) == [8, 9, 9, 6]


def test_stage_assignment_looped_and_v_shaped():
    assert plan_stages(6, 2, 1, "1F1B").stage_ids == (1,)
    assert plan_stages(6, 4, 1, "Interleaved1F1B").stage_ids == (1, 5)
    assert plan_stages(6, 4, 1, "DualPipeV").stage_ids == (1, 6)
    plan = plan_stages(6, 2, 0, "ZBVZeroBubble")
    assert plan.has_first() and plan.has_last()  # rank 0 holds stages 0 and 3


def test_explicit_splits():
    assert plan_stages(6, 2, 0, "1F1B", split_points=[2]).layers == ((0, 1), (2, 3, 4, 5))
    plan = plan_stages(8, 2, 0, "Interleaved1F1B", layers_per_stage=2)
    assert plan.num_stages == 4 and plan.layers[3] == (6, 7)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(n_layers=2, pp=4, pp_rank=0, schedule="Interleaved1F1B"), "8 pipeline stages"),
        (dict(n_layers=6, pp=2, pp_rank=0, schedule="1F1B", split_points=[3, 2]), "increasing"),
        (dict(n_layers=6, pp=2, pp_rank=0, schedule="1F1B", split_points=[2, 4]), "needs 2"),
        (dict(n_layers=6, pp=2, pp_rank=0, schedule="1F1B", layers_per_stage=4), "does not divide"),
        (dict(n_layers=6, pp=4, pp_rank=0, schedule="LoopedBFS", layers_per_stage=3), "evenly"),
    ],
)
def test_impossible_splits(kwargs, expected):
    with pytest.raises(ValueError, match=expected):
        plan_stages(**kwargs)


@pytest.mark.parametrize(
    "schedule, n_mb, pp, stages, expected",
    [
        ("1F1B", 1, 2, 2, "at least 2 microbatches"),
        ("DualPipeV", 3, 2, 4, "at least 4 microbatches"),
        ("Interleaved1F1B", 5, 2, 4, "multiple of 2"),
    ],
)
def test_microbatch_requirements(schedule, n_mb, pp, stages, expected):
    with pytest.raises(ValueError, match=expected):
        check_microbatches(schedule, n_mb, pp, stages)
    check_microbatches("GPipe", 1, 2, 2)


class ListModel(nn.Module):
    """A non-Llama model: blocks in an nn.ModuleList, two input modules, forward tolerating a
    missing embedding or head (the stage contract)."""

    def __init__(self, n_blocks: int = 4, dim: int = 8, vocab: int = 16):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(32, dim)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, dim), nn.Tanh()) for _ in range(n_blocks)
        )
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        if self.wte is not None:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
        for block in self.blocks:
            x = block(x)
        return x if self.head is None else self.head(x)


TOKENS = torch.randint(16, (2, 5), generator=torch.Generator().manual_seed(0))


def run_stages(model, splits, **names):
    """Each stage's module, and their output when run in sequence on TOKENS."""
    stages = [
        build_stage_module(model, layers, s == 0, s == len(splits) - 1, **names)
        for s, layers in enumerate(splits)
    ]
    x = TOKENS
    for stage in stages:
        x = stage(x)
    return stages, x


def test_llama_stages_keep_names_and_compose():
    torch.manual_seed(0)
    args = ModelArgs(dim=32, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=16, max_seq_len=8)
    model = Transformer(args)
    model.init_weights()
    stages, out = run_stages(model, [(0,), (1, 2), (3,)])
    assert list(stages[1].layers.keys()) == ["1", "2"]
    assert stages[1].tok_embeddings is None and stages[1].output is None
    assert stages[0].norm is None and stages[2].tok_embeddings is None
    names = [set(s.state_dict()) for s in stages]
    assert set().union(*names) == set(model.state_dict()) - {"rope_cache"}
    torch.testing.assert_close(out, model(TOKENS), rtol=0, atol=0)


def test_module_list_stages_keep_fqns_and_match_the_whole_model():
    torch.manual_seed(0)
    model = ListModel()
    names = dict(blocks_attr="blocks", input_modules=("wte", "wpe"), output_modules=("head",))
    stages, out = run_stages(model, [(0, 1), (2,), (3,)], **names)
    torch.testing.assert_close(out, model(TOKENS), rtol=0, atol=0)
    # Indices, and so parameter names, are those of the full model: checkpoints load as is.
    assert set(stages[1].state_dict()) == {"blocks.2.0.weight", "blocks.2.0.bias"}
    assert len(stages[1].blocks) == 4 and isinstance(stages[1].blocks[0], BlockOnAnotherStage)
    assert set().union(*(s.state_dict() for s in stages)) == set(model.state_dict())
    # The helpers see only the stage's own blocks.
    assert [i for i, _ in block_items(stages[0], "blocks")] == [0, 1]
    apply_ac(stages[2], "full", blocks_attr="blocks")
    assert isinstance(stages[2].blocks[0], BlockOnAnotherStage)
    assert type(stages[2].blocks[3]).__name__ == "CheckpointWrapper"


def test_stage_names_must_exist():
    with pytest.raises(ValueError, match="no module 'tok_embeddings'.*input_modules="):
        build_stage_module(ListModel(), (0,), True, False, blocks_attr="blocks")
    with pytest.raises(ValueError, match="out of range: blocks holds 4 blocks"):
        build_stage_module(ListModel(), (4,), True, False, "blocks", ("wte",), ("head",))


def test_generic_defaults_are_llamas_names():
    """The helpers' defaults and Llama's family declaration name the same modules."""
    fsdp = inspect.signature(apply_fsdp).parameters
    stage = inspect.signature(build_stage_module).parameters
    assert fsdp["blocks_attr"].default == stage["blocks_attr"].default == LLAMA3.blocks_attr
    assert fsdp["input_group"].default == stage["input_modules"].default == LLAMA3.input_modules
    assert fsdp["output_group"].default == stage["output_modules"].default == LLAMA3.output_modules
