"""The in-place loss on logits sharded over the vocabulary (TP's loss parallel; run as ranks by
``run_ranks`` or torchrun, gloo, CPU): loss and gradients against the plain loss of the whole
logits in one process.

Every rank builds the same inputs. The logits enter as a ``Shard(-1)`` DTensor; a 53-entry
vocabulary does not split evenly, and a few labels are IGNORE_INDEX. Rank 0 prints
``VP_RESULT {json}``: the largest deviations of the loss and of the logits' gradient (relative to
their largest entry), and of the loss computed without gradients (validation's path).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from torchtitan.kernels.inplace_loss import IGNORE_INDEX, inplace_cross_entropy_sum
from torchtitan.loss import cross_entropy_sum

BATCH, SEQ, DIM, VOCAB = 2, 36, 16, 53


def whole_inputs():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(BATCH, SEQ, VOCAB, generator=g) * 3
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    labels[0, :5] = IGNORE_INDEX
    return logits, labels


def reference(logits, labels):
    logits = logits.clone().requires_grad_()
    loss = cross_entropy_sum(logits, labels)
    loss.backward()
    return loss.detach(), logits.grad


def vocab_parallel(mesh, logits, labels):
    sharded = distribute_tensor(logits.clone(), mesh, [Shard(2)]).requires_grad_()
    loss = inplace_cross_entropy_sum(sharded * 1.0, labels)  # the product is what is overwritten
    loss.backward()
    with torch.no_grad():
        loss_only = inplace_cross_entropy_sum(distribute_tensor(logits, mesh, [Shard(2)]), labels)
    return loss.detach(), loss_only, sharded.grad.full_tensor()


def relative_max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest absolute deviation over the largest magnitude (the grads hold near-zeros)."""
    return ((got - want).abs().max() / want.abs().max()).item()


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    logits, labels = whole_inputs()
    ref_loss, ref_grad = reference(logits, labels)
    loss, loss_only, grad = vocab_parallel(mesh, logits, labels)
    result = {
        "tp": mesh.size(),
        "loss_rel": abs(loss.item() / ref_loss.item() - 1),
        "loss_only_rel": abs(loss_only.item() / ref_loss.item() - 1),
        "grad_rel": relative_max_error(grad, ref_grad),
    }
    if dist.get_rank() == 0:
        print("VP_RESULT " + json.dumps(result), flush=True)
    # Every rank is done once all reach the barrier; then leave without torch 2.13's gloo
    # teardown, which aborts now and then in C++ destructors ("terminate called without an active
    # exception"): in destroy_process_group with a DeviceMesh about one run in ten, also in a
    # 9-line script with none of this project's code, and at interpreter exit under load.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
