"""What each activation-checkpointing policy recomputes: counted matmuls in backward."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.parallel.activation_checkpoint import apply_ac

aten = torch.ops.aten
LINEARS_PER_BLOCK = 7  # wq, wk, wv, wo, w1, w3, w2


class CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (aten.mm.default, aten.addmm.default, aten.bmm.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


def backward_matmuls(mode: str, save_matmuls: str = "all") -> int:
    torch.manual_seed(0)
    model = Transformer(get_model_args("debugmodel", max_seq_len=32))
    model.init_weights()
    apply_ac(model, mode, "op", save_matmuls=save_matmuls)
    loss = model(torch.randint(model.args.vocab_size, (2, 32))).float().square().mean()
    with CountMatmuls() as counter:
        loss.backward()
    return counter.count


@pytest.fixture(scope="module")
def no_ac() -> int:
    return backward_matmuls("none")


def test_no_ac_backward_has_two_matmuls_per_linear(no_ac):
    n_layers = get_model_args("debugmodel").n_layers
    # grad_input and grad_weight per block linear, plus the output head's two
    assert no_ac == 2 * LINEARS_PER_BLOCK * n_layers + 2


def test_selective_op_all_recomputes_no_matmul(no_ac):
    assert backward_matmuls("selective", "all") == no_ac


def test_selective_op_alternate_recomputes_every_second_matmul(no_ac):
    n_layers = get_model_args("debugmodel").n_layers
    # wk, wo and w3 (the 2nd, 4th and 6th matmul of a block) are recomputed
    assert backward_matmuls("selective", "alternate") == no_ac + 3 * n_layers


def test_full_recomputes_every_matmul_backward_needs(no_ac):
    n_layers = get_model_args("debugmodel").n_layers
    # all but w2: non-reentrant checkpointing stops recomputing once it has every tensor that
    # backward saved, and w2's output is not one (its backward needs its input and weight)
    assert backward_matmuls("full") == no_ac + (LINEARS_PER_BLOCK - 1) * n_layers


def test_unknown_save_matmuls_is_rejected():
    model = Transformer(get_model_args("debugmodel", max_seq_len=32))
    with pytest.raises(ValueError, match="save_matmuls must be one of"):
        apply_ac(model, "selective", save_matmuls="half")
