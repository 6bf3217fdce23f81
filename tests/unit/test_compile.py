"""Regional compile: every block compiled, same loss and gradients as eager."""

import os

import pytest
import torch

from tests.unit.test_train import grads_after_one_step, make_trainer


def test_compiled_blocks_match_eager(tmp_path):
    eager = grads_after_one_step(make_trainer(tmp_path / "eager"))
    trainer = make_trainer(tmp_path / "compiled", "--compile.enable")
    assert all(type(b).__name__ == "OptimizedModule" for b in trainer.model.layers.values())
    compiled = grads_after_one_step(trainer)
    compiled = {k.replace("._orig_mod", ""): v for k, v in compiled.items()}
    assert compiled.keys() == eager.keys()
    for name, grad in eager.items():
        torch.testing.assert_close(compiled[name], grad, rtol=1e-4, atol=1e-6)


def test_per_rank_compile_cache_folder(monkeypatch, tmp_path):
    from torchtitan.parallel.compile import use_per_rank_compile_cache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    use_per_rank_compile_cache(3)
    use_per_rank_compile_cache(3)  # idempotent
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "rank_3")


def test_compiled_blocks_with_alternate_matmul_ac_match_eager(tmp_path):
    # The selective policy counts matmuls; under compile it runs while AOT traces the block.
    eager = grads_after_one_step(make_trainer(tmp_path / "eager"))
    trainer = make_trainer(
        tmp_path / "compiled",
        "--compile.enable",
        "--activation_checkpoint.mode=selective",
        "--activation_checkpoint.save_matmuls=alternate",
    )
    compiled = grads_after_one_step(trainer)
    strip = ("._orig_mod", "._checkpoint_wrapped_module")
    for old in strip:
        compiled = {k.replace(old, ""): v for k, v in compiled.items()}
    assert compiled.keys() == eager.keys()
    for name, grad in eager.items():
        torch.testing.assert_close(compiled[name], grad, rtol=1e-4, atol=1e-6)


def test_first_block_input_is_cloned_only_when_asked():
    from torchtitan.models.llama3 import Transformer
    from torchtitan.models.llama3.args import MODEL_FLAVORS
    from torchtitan.parallel.compile import apply_compile

    def first_block_hooks(clone: bool) -> int:
        with torch.device("meta"):
            model = Transformer(MODEL_FLAVORS["debugmodel"])
        apply_compile(model, clone_first_input=clone)
        return len(model.layers["0"]._forward_pre_hooks)

    assert first_block_hooks(False) == 0
    assert first_block_hooks(True) == 1


def test_in_place_compile_keeps_the_blocks_and_their_names_for_an_outer_checkpoint():
    """``in_place``: what parallelize does under TP with whole-block checkpointing, so
    the checkpoint wrapper goes around the compiled block and DCP's names stay the plain ones."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from torchtitan.models.llama3 import Transformer, get_model_args
    from torchtitan.parallel.activation_checkpoint import apply_ac
    from torchtitan.parallel.compile import apply_compile

    def model():
        torch.manual_seed(0)
        m = Transformer(get_model_args("debugmodel", max_seq_len=32))
        m.init_weights()
        return m

    plain, wrapped, wrapper_outside = model(), model(), model()
    apply_compile(wrapped, in_place=True)
    for block in wrapped.layers.values():
        assert type(block) is type(plain.layers["0"])
        assert hasattr(block.__dict__["forward"], "_torchdynamo_orig_callable")  # compiled
    apply_ac(wrapped, "full")
    assert all(isinstance(b, CheckpointWrapper) for b in wrapped.layers.values())
    assert get_model_state_dict(wrapped).keys() == get_model_state_dict(plain).keys()
    # Why in place: a checkpoint wrapper around torch.compile's wrapper leaves "_orig_mod" in
    # DCP's names (torch 2.13), so such a checkpoint would not load into another layout.
    apply_compile(wrapper_outside)
    apply_ac(wrapper_outside, "full")
    assert get_model_state_dict(wrapper_outside).keys() != get_model_state_dict(plain).keys()
    tokens = torch.randint(256, (2, 32))
    losses = [m(tokens).float().square().mean() for m in (plain, wrapped)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    grads = [m.layers["1"].feed_forward.w2.weight.grad for m in (plain, wrapped)]
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)


def _order_of_wait_and_matmul(reorder: bool) -> list[str]:
    """Inductor's code for: issue an all-to-all, do a matmul, then use the all-to-all's result
    (CP's K/V-gradient exchange and the next chunk's attention backward, in miniature)."""
    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch._inductor.utils import run_and_get_code

    from torchtitan.parallel.compile import OVERLAP_PASSES

    def step(x, a, b):
        sent = funcol.all_to_all_single(x * 2, None, None, dist.group.WORLD)
        z = torch.mm(a, b)
        return funcol.wait_tensor(sent) + z.sum()

    torch._dynamo.reset()
    passes = list(OVERLAP_PASSES) if reorder else []
    with inductor_config.patch(
        reorder_for_compute_comm_overlap=reorder, reorder_for_compute_comm_overlap_passes=passes
    ):
        fn = torch.compile(step, fullgraph=True)
        _, (code,) = run_and_get_code(fn, torch.randn(64), torch.randn(64, 64), torch.randn(64, 64))
    order = []
    for line in code.splitlines():
        if "wait_tensor.default(" in line and "wait" not in order:
            order.append("wait")
        elif "extern_kernels.mm(" in line:
            order.append("mm")
    return order


def test_reordering_waits_for_the_collective_after_the_independent_matmul(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        assert _order_of_wait_and_matmul(reorder=False) == ["wait", "mm"]  # exposed
        assert _order_of_wait_and_matmul(reorder=True) == ["mm", "wait"]  # overlapped
    finally:
        dist.destroy_process_group()


def test_reorder_collectives_is_on_by_default_and_sets_inductors_passes():
    import torch._inductor.config as inductor_config

    from torchtitan.config import Compile
    from torchtitan.models.llama3 import Transformer, get_model_args
    from torchtitan.parallel.compile import OVERLAP_PASSES, apply_compile

    assert Compile().reorder_collectives
    with torch.device("meta"):
        model = Transformer(get_model_args("debugmodel", max_seq_len=32))
    restored = dict(
        reorder_for_compute_comm_overlap=False, reorder_for_compute_comm_overlap_passes=[]
    )
    with inductor_config.patch(**restored):  # restored on exit
        apply_compile(model, reorder_collectives=True)
        assert inductor_config.reorder_for_compute_comm_overlap
        assert inductor_config.reorder_for_compute_comm_overlap_passes == list(OVERLAP_PASSES)


@pytest.mark.parametrize(
    "option, inductor_flag",
    [
        ("reorder_collectives", "reorder_for_compute_comm_overlap"),
        ("tune_kernels", "coordinate_descent_tuning"),
    ],
)
def test_the_trainer_sets_the_inductor_option_unless_told_not_to(tmp_path, option, inductor_flag):
    import torch._inductor.config as inductor_config

    for flag, expected in (("true", True), ("false", False)):
        setattr(inductor_config, inductor_flag, False)  # conftest restores it
        trainer = make_trainer(tmp_path / flag, "--compile.enable", f"--compile.{option}={flag}")
        trainer.close()
        assert getattr(inductor_config, inductor_flag) is expected


def test_tune_kernels_is_off_by_default_and_sets_coordinate_descent_tuning():
    import torch._inductor.config as inductor_config

    from torchtitan.config import Compile
    from torchtitan.models.llama3 import Transformer, get_model_args
    from torchtitan.parallel.compile import apply_compile

    assert not Compile().tune_kernels
    with torch.device("meta"):
        models = [Transformer(get_model_args("debugmodel", max_seq_len=32)) for _ in range(2)]
    with inductor_config.patch(coordinate_descent_tuning=False):  # restored on exit
        apply_compile(models[0])
        assert not inductor_config.coordinate_descent_tuning  # the helper's default: off
        apply_compile(models[1], tune_kernels=True)
        assert inductor_config.coordinate_descent_tuning
