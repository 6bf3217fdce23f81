"""Context-parallel numerics check of the debug Llama (run under torchrun, gloo, CPU).

Every rank builds the same model (seeded CPU init) and batch. (a) Reference: the full sequence,
no CP: loss = sum cross-entropy / (B*T), and its grads. (b) Under ``cp_context`` on a 1-D mesh of
all ranks, with buffers [inputs, labels, rope_cache] sharded on [1, 1, 0], each rank's loss is its
summed cross-entropy / its local tokens B*T/cp (what the trainer uses, so that averaging over the
dp_shard x cp mesh gives the global mean). Then the global loss is all_reduce(local sums) / (B*T)
and the grads all_reduce(SUM) / cp (= FSDP's average). Both must match (a).

Rank 0 prints one line ``CP_RESULT {json}`` with the deviations per variant.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.parallel.context_parallel import cp_context

SEQ_LEN, BATCH = 64, 2
VARIANTS = [("allgather", True), ("alltoall", True), ("allgather", False)]


def summed_loss(model, inputs, labels):
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")


def expected_positions(balance: bool, cp: int) -> torch.Tensor:
    """This rank's token positions: chunks r and 2cp-1-r of 2cp (head-tail), or chunk r of cp."""
    r = dist.get_rank()
    if not balance:
        return torch.arange(SEQ_LEN).chunk(cp)[r]
    chunks = torch.arange(SEQ_LEN).chunk(2 * cp)
    return torch.cat([chunks[r], chunks[2 * cp - 1 - r]])


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    cp = dist.get_world_size()
    mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))

    torch.manual_seed(0)
    model = Transformer(get_model_args("debugmodel", max_seq_len=SEQ_LEN))
    model.init_weights()
    g = torch.Generator().manual_seed(1)
    vocab = model.args.vocab_size
    inputs = torch.randint(vocab, (BATCH, SEQ_LEN), generator=g)
    labels = torch.randint(vocab, (BATCH, SEQ_LEN), generator=g)
    rope = model.rope_cache.clone()
    tokens = BATCH * SEQ_LEN

    def reference():
        model.zero_grad(set_to_none=True)
        loss = summed_loss(model, inputs, labels) / tokens
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}

    ref_loss, ref_grads = reference()
    results = {}
    for rotate, balance in VARIANTS:
        model.zero_grad(set_to_none=True)
        inp, lab = inputs.clone(), labels.clone()
        t0 = time.perf_counter()
        with cp_context(mesh, [inp, lab, model.rope_cache], [1, 1, 0], rotate, balance):
            assert inp.shape == (BATCH, SEQ_LEN // cp), inp.shape
            assert model.rope_cache.shape[0] == SEQ_LEN // cp
            assert torch.equal(inp, inputs[:, expected_positions(balance, cp)])
            assert torch.equal(model.rope_cache, rope[expected_positions(balance, cp)])
            local_sum = summed_loss(model, inp, lab)
            (local_sum / inp.numel()).backward()  # normalised by the local tokens B*T/cp
        seconds = time.perf_counter() - t0
        # context_parallel restores every buffer on exit
        assert inp.shape == inputs.shape and torch.equal(inp, inputs)
        assert torch.equal(lab, labels) and torch.equal(model.rope_cache, rope)

        total = local_sum.detach().clone()
        dist.all_reduce(total)
        loss = total.item() / tokens
        grad_dev = 0.0
        for n, p in model.named_parameters():
            grad = p.grad.clone()
            dist.all_reduce(grad)
            grad /= cp
            grad_dev = max(grad_dev, (grad - ref_grads[n]).abs().max().item())
            torch.testing.assert_close(grad, ref_grads[n], rtol=1e-5, atol=1e-6, msg=n)
        loss_rel = abs(loss - ref_loss) / abs(ref_loss)
        assert loss_rel < 1e-5, (rotate, balance, loss, ref_loss)
        name = f"{rotate}{'' if balance else '_nolb'}"
        results[name] = {"loss_rel": loss_rel, "grad_abs": grad_dev, "seconds": round(seconds, 3)}

    # SDPA outside the context is plain local attention again.
    again, _ = reference()
    assert again == ref_loss, (again, ref_loss)

    if dist.get_rank() == 0:
        print("CP_RESULT " + json.dumps({"cp": cp, "ref_loss": ref_loss, **results}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
