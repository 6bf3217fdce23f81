import math

import pytest
import torch

from torchtitan.config import LRScheduler, Optimizer
from torchtitan.optim import (
    build_lr_scheduler,
    build_optimizer,
    clip_grad_norm,
    lr_factor,
    resume_lr_scheduler,
)


def test_linear_warmup_then_linear_decay_to_min():
    cfg = LRScheduler(warmup_steps=4, decay_type="linear", min_lr_ratio=0.1)
    factors = [lr_factor(s, 10, cfg) for s in range(1, 11)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert factors[4] == pytest.approx(0.1 + 0.9 * (1 - 1 / 6))
    assert factors[-1] == pytest.approx(0.1)


def test_cosine_decay_midpoint_and_end():
    cfg = LRScheduler(warmup_steps=0, decay_type="cosine", min_lr_ratio=0.0)
    assert lr_factor(5, 10, cfg) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(10, 10, cfg) == pytest.approx(0.0)


def test_no_decay_and_warmup_longer_than_training():
    assert lr_factor(50, 100, LRScheduler(warmup_steps=10, decay_type="none")) == 1.0
    assert lr_factor(5, 5, LRScheduler(warmup_steps=10)) == 0.5


def test_scheduler_drives_optimizer_lr_per_step():
    param = torch.nn.Parameter(torch.zeros(2))
    opt = build_optimizer([param], Optimizer(lr=1.0), "cpu")
    cfg = LRScheduler(warmup_steps=2, decay_type="linear", min_lr_ratio=0.0)
    sched = build_lr_scheduler(opt, 4, cfg)
    seen = []
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.5, 1.0, 0.5, 0.0])


def lrs_of_steps(sched, opt, steps: int) -> list[float]:
    """The lr each of the next ``steps`` optimizer steps uses."""
    seen = []
    for _ in range(steps):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return seen


def test_resume_restores_the_step_count_and_follows_the_new_schedule():
    """6 of 6 steps, resumed with 10 steps and another peak lr: steps 7-10 use exactly what an
    uninterrupted 10-step run with the new peak uses; the checkpoint's last lr is ignored."""
    cfg = LRScheduler(warmup_steps=2, decay_type="linear", min_lr_ratio=0.1)
    param = torch.nn.Parameter(torch.zeros(2))
    old = build_optimizer([param], Optimizer(lr=3e-3), "cpu")
    old_sched = build_lr_scheduler(old, 6, cfg)
    lrs_of_steps(old_sched, old, 6)
    saved = old_sched.state_dict()

    straight = build_optimizer([param], Optimizer(lr=1e-2), "cpu")
    expected = lrs_of_steps(build_lr_scheduler(straight, 10, cfg), straight, 10)[6:]
    new = build_optimizer([param], Optimizer(lr=1e-2), "cpu")
    new_sched = build_lr_scheduler(new, 10, cfg)
    new.param_groups[0].update(lr=3e-4, initial_lr=3e-3)  # as the checkpoint's optimizer state
    resume_lr_scheduler(new_sched, saved)
    assert new_sched.last_epoch == 6
    assert new_sched.get_last_lr() == [expected[0]]
    assert lrs_of_steps(new_sched, new, 4) == expected  # exactly, from the first resumed step
    assert expected[0] == pytest.approx(1e-2 * (0.1 + 0.9 * 3 / 8))


@pytest.mark.parametrize("impl", ["foreach", "for-loop", "fused", "compiled"])
@pytest.mark.parametrize("name", ["AdamW", "Adam"])
def test_optimizer_implementations_agree(name, impl):
    torch.manual_seed(0)
    ref = torch.randn(8)
    results = []
    for variant in ["for-loop", impl]:
        p = torch.nn.Parameter(ref.clone())
        compiled = variant == "compiled"  # the experimental switch (a CUDA one; runs on CPU too)
        cfg = Optimizer(name=name, lr=0.1, implementation="foreach" if compiled else variant)
        opt = build_optimizer([p], cfg, "cuda" if compiled else "cpu", compiled_adamw=compiled)
        for _ in range(3):
            p.grad = p.detach() * 2
            opt.step()
        results.append(p.detach())
    torch.testing.assert_close(results[0], results[1])


def test_clip_grad_norm_returns_preclip_norm_and_clips():
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(4))
    a.grad, b.grad = torch.full((3,), 2.0), torch.full((4,), 2.0)
    norm = clip_grad_norm([a, b], max_norm=1.0)
    assert norm.item() == pytest.approx(math.sqrt(7 * 4))
    total = torch.cat([a.grad, b.grad]).norm()
    assert total.item() == pytest.approx(1.0, rel=1e-5)


def test_clip_disabled_keeps_gradients():
    a = torch.nn.Parameter(torch.zeros(3))
    a.grad = torch.full((3,), 5.0)
    clip_grad_norm([a], max_norm=0)
    assert torch.equal(a.grad, torch.full((3,), 5.0))
