"""The optimizer update run unit by unit (``--optimizer.overlap_forward``): same weights and state
as one ``step``, hooks that wait for each unit before its forward, and the trainer's curve.

The CUDA streams themselves are exercised on GPU (tests/gpu/test_overlapped_update_gpu.py); on CPU
the units update one after another at ``step``, through the same code."""

import pytest
import torch

from tests.unit.test_train import make_trainer
from torchtitan.config import Optimizer
from torchtitan.models.llama3 import ModelArgs, Transformer
from torchtitan.optim import build_optimizer
from torchtitan.overlapped_update import OverlappedUpdate, forward_units, only

ARGS = ModelArgs(dim=64, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=128, max_seq_len=32)


def model_and_grads(seed: int = 0):
    torch.manual_seed(seed)
    model = Transformer(ARGS)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    return model


def test_units_cover_every_parameter_once_in_forward_order():
    model = Transformer(ARGS)
    model.extra = torch.nn.Linear(2, 2)  # in no group: a first unit, waited for at the root
    units = forward_units(model)
    names = {id(p): n for n, p in model.named_parameters()}
    got = [[names[id(p)] for p in u.params] for u in units]
    assert got[0] == ["extra.weight", "extra.bias"]
    assert got[1] == ["tok_embeddings.weight"]
    assert [g[0].split(".")[1] for g in got[2:5]] == ["0", "1", "2"]
    assert got[5] == ["norm.weight", "output.weight"]
    assert units[0].modules == [model]
    assert sorted(n for g in got for n in g) == sorted(names.values())


@pytest.mark.parametrize("impl", ["foreach", "for-loop", "fused", "compiled"])
def test_unit_by_unit_update_equals_one_step_bitwise(impl):
    results = []
    for by_unit in (False, True):
        model = model_and_grads()
        opt = build_optimizer(
            model.parameters(), Optimizer(lr=1e-2, weight_decay=0.1, implementation=impl), "cpu"
        )
        for step in range(3):
            for p in model.parameters():
                p.grad = torch.randn_like(p, generator=torch.Generator().manual_seed(step))
            if impl in ("fused", "compiled"):  # the kernels that take clipping and the skip flag
                opt.grad_scale = torch.tensor(1.5 + step)
                opt.found_inf = torch.tensor(1.0 if step == 1 else 0.0)
            if by_unit:
                for unit in forward_units(model):
                    with only(opt, unit):
                        opt.step()
            else:
                opt.step()
        state = [opt.state[p][k].clone() for p in model.parameters() for k in sorted(opt.state[p])]
        results.append(([p.detach().clone() for p in model.parameters()], state))
    for a, b in zip(results[0][0] + results[0][1], results[1][0] + results[1][1], strict=True):
        assert torch.equal(a, b)
    assert len(opt.param_groups[0]["params"]) == len(list(model.parameters()))  # restored


def test_each_units_forward_waits_for_its_update_and_scales():
    model = model_and_grads()
    opt = build_optimizer(model.parameters(), Optimizer(implementation="foreach"), "cpu")
    scaled = []
    update = OverlappedUpdate(
        [forward_units(model)],
        [opt],
        precompute_scales=lambda owners: scaled.append({id(m) for m in owners}),
        device=torch.device("cpu"),
    )
    assert not update.ready()  # the first update creates the optimizer state
    opt.step()
    assert update.ready()
    update.step()
    assert update.pending
    model(torch.zeros(1, 8, dtype=torch.long))
    assert not update.pending
    layers = model.layers
    assert scaled == [
        {id(model.tok_embeddings)},
        *[{id(m) for m in layers[k].modules() if list(m.parameters(recurse=False))} for k in "012"],
        {id(model.norm), id(model.output)},
    ]
    scaled.clear()
    model(torch.zeros(1, 8, dtype=torch.long))
    assert scaled == []  # nothing queued since: no wait, no new scales
    update.step()
    update.flush()  # a checkpoint: every unit at once
    assert not update.pending and len(scaled) == 1 and len(scaled[0]) == 5


def test_trainer_curve_is_unchanged_with_a_checkpoint_and_validation_in_between(tmp_path):
    runs = []
    for overlap in ("false", "true"):
        trainer = make_trainer(
            tmp_path / overlap,
            f"--optimizer.overlap_forward={overlap}",
            "--checkpoint.enable",
            "--checkpoint.interval=3",
            "--validation.enable",
            "--validation.freq=2",
            "--validation.steps=1",
        )
        runs.append(trainer.train())
        assert trainer.overlap is None if overlap == "false" else not trainer.overlap.pending
        trainer.close()
    assert runs[0] == runs[1]
