"""The compiled Adam/AdamW kernel against torch's fused kernel, and the clipping it absorbs."""

import copy

import pytest
import torch

from torchtitan.config import ConfigError, Optimizer
from torchtitan.experimental.compiled_adamw import (
    CompiledAdam,
    CompiledAdamW,
    _adam_update,
    compiled_update,
)
from torchtitan.optim import (
    build_optimizer,
    check_optimizer,
    clip_grad_norm,
    resolve_implementation,
    takes_scale_and_skip,
)

SHAPES = [(64, 32), (32,), (7, 5)]


def params_like(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]


def run_steps(opt, params, steps: int = 6, skip_step: int = 3, scale: float = 1.7):
    """Steps with changing lr and gradients; ``skip_step`` is flagged non-finite."""
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.found_inf = torch.tensor(1.0 if step == skip_step else 0.0)
        opt.grad_scale = torch.tensor(scale)
        opt.param_groups[0]["lr"] = 1e-2 * (step + 1)
        opt.step()


@pytest.mark.parametrize(
    "compiled_cls, torch_cls, betas, weight_decay",
    [
        (CompiledAdamW, torch.optim.AdamW, (0.9, 0.95), 0.1),
        (CompiledAdamW, torch.optim.AdamW, (0.9, 0.999), 0.0),
        (CompiledAdam, torch.optim.Adam, (0.8, 0.99), 0.01),
    ],
)
def test_matches_torchs_fused_kernel(compiled_cls, torch_cls, betas, weight_decay):
    """Several hyperparameter sets in one process: the kernel is compiled once with dynamic
    sizes, and hyperparameters passed as Python floats once made a recompiled kernel wrong."""
    ours, ref = params_like(), params_like()
    kwargs = dict(lr=1e-2, betas=betas, weight_decay=weight_decay, eps=1e-8)
    opt_ours = compiled_cls(ours, **kwargs)
    opt_ref = torch_cls(ref, fused=True, **kwargs)
    run_steps(opt_ours, ours)
    run_steps(opt_ref, ref)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(opt_ours.state[a][key], opt_ref.state[b][key])
    assert opt_ours.state[ours[0]]["step"].item() == 5  # the flagged step did not count


def test_non_finite_step_changes_nothing():
    params = params_like()
    before = [p.detach().clone() for p in params]
    opt = CompiledAdamW(params, lr=0.1)
    for p in params:
        p.grad = torch.full(p.shape, float("nan"))
    opt.found_inf = torch.tensor(1.0)
    opt.step()
    for p, b in zip(params, before):
        assert torch.equal(p.detach(), b)
        assert torch.equal(opt.state[p]["exp_avg"], torch.zeros_like(b))
    assert opt.state[params[0]]["step"].item() == 0


def test_checkpoints_move_between_fused_and_compiled():
    """Same state layout: a fused run's optimizer state continues in the compiled kernel (and
    back) exactly as the fused run itself continues."""
    straight = params_like()
    opt = torch.optim.AdamW(straight, lr=1e-2, fused=True)
    run_steps(opt, straight, steps=3, skip_step=-1)
    saved_params = [p.detach().clone() for p in straight]
    saved_state = copy.deepcopy(opt.state_dict())  # state_dict() shares the live tensors
    run_steps(opt, straight, steps=3, skip_step=-1)

    resumed = [torch.nn.Parameter(p.clone()) for p in saved_params]
    compiled = CompiledAdamW(resumed, lr=1e-2)
    compiled.load_state_dict(saved_state)
    run_steps(compiled, resumed, steps=3, skip_step=-1)
    for a, b in zip(resumed, straight):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    back = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone()) for p in resumed], lr=1e-2)
    back.load_state_dict(compiled.state_dict())  # and the compiled state loads into torch's


def test_a_non_contiguous_parameter_is_updated_in_place():
    base = torch.randn(8, 6)
    param = torch.nn.Parameter(base.t())  # a transposed view: not contiguous
    ref = torch.nn.Parameter(base.t().clone())
    for p, cls in ((param, CompiledAdamW), (ref, torch.optim.AdamW)):
        p.grad = torch.ones(6, 8)
        cls([p], lr=0.1).step()
    torch.testing.assert_close(param, ref)


def test_the_update_function_matches_eager_after_recompiles():
    update = compiled_update()
    gen = torch.Generator().manual_seed(0)
    for beta2, decoupled in [(0.95, True), (0.999, True), (0.999, False)]:
        for n in (256, 4096, 300):
            tensors = [torch.randn(n, generator=gen) for _ in range(2)]
            tensors += [torch.rand(n, generator=gen) * 0.01, torch.rand(n, generator=gen) * 1e-4]
            hyper = torch.tensor([3e-4, 0.9, beta2, 1e-8, 0.1])
            scalars = [torch.tensor(2.0), hyper, torch.tensor(1.5), torch.tensor(0.0)]
            eager = [t.clone() for t in tensors] + [s.clone() for s in scalars]
            compiled = [t.clone() for t in tensors] + [s.clone() for s in scalars]
            _adam_update(*eager, decoupled)
            update(*compiled, decoupled)
            for a, b in zip(eager[:5], compiled[:5]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_clipping_goes_to_the_kernel_as_grad_scale():
    """With optimizers that take grad_scale, clip_grad_norm leaves the gradients alone and the
    step equals the one after clipping in place."""
    folded, in_place = params_like(), params_like()
    for group in (folded, in_place):
        for p in group:
            p.grad = torch.full(p.shape, 3.0)
    opt_folded = CompiledAdamW(folded, lr=1e-2)
    opt_in_place = torch.optim.AdamW(in_place, lr=1e-2, foreach=True)
    norm = clip_grad_norm(folded, max_norm=1.0, optimizers=[opt_folded])
    assert torch.equal(folded[0].grad, torch.full(SHAPES[0], 3.0))
    torch.testing.assert_close(opt_folded.grad_scale, (norm.float() + 1e-6) / 1.0)
    clip_grad_norm(in_place, max_norm=1.0, optimizers=[opt_in_place])
    assert not hasattr(opt_in_place, "grad_scale")
    opt_folded.step()
    opt_in_place.step()
    for a, b in zip(folded, in_place):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_a_small_norm_is_not_scaled_up():
    params = params_like()
    for p in params:
        p.grad = torch.full(p.shape, 1e-3)
    opt = CompiledAdamW(params, lr=1e-2)
    clip_grad_norm(params, max_norm=1.0, optimizers=[opt])
    assert opt.grad_scale.item() == 1.0


def test_which_kernels_take_scale_and_skip():
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert takes_scale_and_skip(CompiledAdamW(p))
    assert takes_scale_and_skip(torch.optim.AdamW(p, fused=True))
    assert not takes_scale_and_skip(torch.optim.AdamW(p, foreach=True))


def test_auto_picks_the_kernel_by_device():
    assert resolve_implementation("auto", "cpu") == "foreach"
    assert resolve_implementation("auto", "cuda") == "fused"
    assert resolve_implementation("for-loop", "cuda") == "for-loop"


def test_compiled_with_distributed_parameters_is_refused_before_training():
    check_optimizer(True, parameters_distributed=False)
    check_optimizer(False, parameters_distributed=True)
    with pytest.raises(ConfigError, match="turn it off"):
        check_optimizer(True, parameters_distributed=True)
    # The switch acts on CUDA only; on CPU the configured kernel runs.
    assert isinstance(build_optimizer(params_like(), Optimizer(), "cuda", True), CompiledAdamW)
    assert type(build_optimizer(params_like(), Optimizer(), "cpu", True)) is torch.optim.AdamW
