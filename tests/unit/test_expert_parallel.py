"""The pieces of expert parallelism that need no process group."""

import torch

from torchtitan.parallel.expert_parallel import _expert_major_order, check_expert_parallel


def test_arrived_rows_are_regrouped_by_local_expert_then_source():
    received = torch.tensor([[2, 0, 1], [1, 3, 0]])  # [source rank, local expert]
    # Rows as they arrive: source 0's (e0 x2, e2 x1), then source 1's (e0 x1, e1 x3).
    labels = [(s, e) for s in range(2) for e in range(3) for _ in range(int(received[s, e]))]
    order = _expert_major_order(received).tolist()
    assert sorted(order) == list(range(len(labels)))
    regrouped = [labels[i] for i in order]
    assert regrouped == sorted(labels, key=lambda se: (se[1], se[0]))


def test_empty_exchange_gives_an_empty_order():
    assert _expert_major_order(torch.zeros(2, 4, dtype=torch.int64)).numel() == 0


def test_expert_parallel_degree_checks():
    assert check_expert_parallel(None, 1) is None
    assert check_expert_parallel(8, 4) is None
    assert "must divide the 8 experts" in check_expert_parallel(8, 3)
    assert "needs a MoE flavor" in check_expert_parallel(None, 2)
