import math

import pytest
import torch

from torchtitan.config import LRScheduler, Optimizer
from torchtitan.optim import build_lr_scheduler, build_optimizer, clip_grad_norm, lr_factor


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


@pytest.mark.parametrize("impl", ["foreach", "for-loop", "fused"])
@pytest.mark.parametrize("name", ["AdamW", "Adam"])
def test_optimizer_implementations_agree(name, impl):
    torch.manual_seed(0)
    ref = torch.randn(8)
    results = []
    for variant in ["for-loop", impl]:
        p = torch.nn.Parameter(ref.clone())
        opt = build_optimizer([p], Optimizer(name=name, lr=0.1, implementation=variant), "cpu")
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
