"""The one owner of the loss choice: ``build_summed_loss`` and ``per_step_loss``."""

import torch
import torch.nn.functional as F

from torchtitan.kernels.inplace_loss import inplace_cross_entropy_sum
from torchtitan.loss import build_summed_loss, cross_entropy_sum, per_step_loss


def test_cross_entropy_sum_is_the_summed_token_loss():
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(2, 5, 11, generator=g), torch.randint(0, 11, (2, 5), generator=g)
    want = F.cross_entropy(logits.reshape(10, 11), labels.reshape(10), reduction="sum")
    torch.testing.assert_close(cross_entropy_sum(logits, labels), want)


def test_build_summed_loss_picks_by_choice_and_device():
    assert build_summed_loss("auto", compiled=False, cuda=False) is cross_entropy_sum
    assert build_summed_loss("standard", compiled=False, cuda=True) is cross_entropy_sum
    assert build_summed_loss("in_place", compiled=False, cuda=False) is inplace_cross_entropy_sum
    compiled = build_summed_loss("standard", compiled=True, cuda=False)
    assert compiled is not cross_entropy_sum and callable(compiled)


def test_per_step_loss_divides_by_the_step_tokens():
    logits, labels = torch.zeros(1, 4, 3), torch.zeros(1, 4, dtype=torch.long)
    step_loss = per_step_loss(cross_entropy_sum, step_tokens=8)
    torch.testing.assert_close(step_loss(logits, labels), cross_entropy_sum(logits, labels) / 8)
