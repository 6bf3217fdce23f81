"""Stage planning and schedule validation (no processes)."""

import pytest

from torchtitan.parallel.pipeline import balanced_split, check_microbatches, plan_stages


def test_balanced_split_counts_embedding_and_head():
    # 6 layers + embedding + head = 8 units over 2 stages: 3 layers + emb, 3 layers + head
    assert balanced_split(6, 2) == ((0, 1, 2), (3, 4, 5))
    # over 8 stages: first holds only the embedding, last only the head
    assert balanced_split(6, 8) == ((), (0,), (1,), (2,), (3,), (4,), (5,), ())
    assert balanced_split(32, 4) == (
        tuple(range(0, 8)),
        tuple(range(8, 17)),
        tuple(range(17, 25)),
        tuple(range(25, 32)),
    )


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
