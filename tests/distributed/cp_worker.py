"""Context-parallel numerics check of the debug Llama (ranks from ``run_ranks`` or torchrun; gloo).

Every rank builds the same model (seeded CPU init) and batch. (a) Reference: the full sequence,
no CP: loss = sum cross-entropy / (B*T), and its grads. (b) Under ``cp_context`` on a 1-D mesh of
all ranks, with buffers [inputs, labels, rope_cache] sharded on [1, 1, 0], each rank's loss is its
summed cross-entropy / its local tokens B*T/cp (what the trainer uses, so that averaging over the
dp_shard x cp mesh gives the global mean). Then the global loss is all_reduce(local sums) / (B*T)
and the grads all_reduce(SUM) / cp (= FSDP's average). Both must match (a).

Rank 0 prints one line ``CP_RESULT {json}`` with the deviations per variant. With
``--device cuda`` the same check runs on NCCL through PyTorch's own CUDA CP path (fp32: SDPA picks
the efficient-attention kernel); ``--save PATH`` writes the losses and grads so the CPU and CUDA
paths can be compared with each other (tests/gpu/test_cp_paths.py).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.parallel.context_parallel import cp_context

BATCH = 2
VARIANTS = [("allgather", True), ("alltoall", True), ("allgather", False)]


def summed_loss(model, inputs, labels):
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")


def cpu(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: g.detach().cpu() for n, g in grads.items()}


def expected_positions(seq_len: int, balance: bool, cp: int) -> torch.Tensor:
    """This rank's token positions: chunks r and 2cp-1-r of 2cp (head-tail), or chunk r of cp."""
    r = dist.get_rank()
    if not balance:
        return torch.arange(seq_len).chunk(cp)[r]
    chunks = torch.arange(seq_len).chunk(2 * cp)
    return torch.cat([chunks[r], chunks[2 * cp - 1 - r]])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--save", default=None, help="rank 0 saves losses and grads here")
    # CUDA's efficient-attention kernel pads its logsumexp to a multiple of 32 tokens, and CP's
    # ring merge then fails (torch 2.11) unless each half chunk, seq_len / (2 * cp), is one.
    parser.add_argument("--seq-len", type=int, default=64)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = torch.device("cuda", torch.cuda.current_device())
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=60))
    cp, seq_len = dist.get_world_size(), args.seq_len
    mesh = init_device_mesh(device.type, (cp,), mesh_dim_names=("cp",))

    # Seeded on CPU, then moved: both devices train bitwise-identical weights and batches.
    torch.manual_seed(0)
    model = Transformer(get_model_args("debugmodel", max_seq_len=seq_len))
    model.init_weights()
    model.to(device)
    g = torch.Generator().manual_seed(1)
    vocab = model.args.vocab_size
    inputs = torch.randint(vocab, (BATCH, seq_len), generator=g).to(device)
    labels = torch.randint(vocab, (BATCH, seq_len), generator=g).to(device)
    rope = model.rope_cache.clone()
    tokens = BATCH * seq_len

    def reference():
        model.zero_grad(set_to_none=True)
        loss = summed_loss(model, inputs, labels) / tokens
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}

    ref_loss, ref_grads = reference()
    results, saved = {}, {"ref": {"loss": ref_loss, "grads": cpu(ref_grads)}}
    for rotate, balance in VARIANTS:
        model.zero_grad(set_to_none=True)
        inp, lab = inputs.clone(), labels.clone()
        t0 = time.perf_counter()
        with cp_context(mesh, [inp, lab, model.rope_cache], [1, 1, 0], rotate, balance):
            assert inp.shape == (BATCH, seq_len // cp), inp.shape
            assert model.rope_cache.shape[0] == seq_len // cp
            positions = expected_positions(seq_len, balance, cp).to(device)
            assert torch.equal(inp, inputs[:, positions])
            assert torch.equal(model.rope_cache, rope[positions])
            local_sum = summed_loss(model, inp, lab)
            (local_sum / inp.numel()).backward()  # normalised by the local tokens B*T/cp
        seconds = time.perf_counter() - t0
        # context_parallel restores every buffer on exit
        assert inp.shape == inputs.shape and torch.equal(inp, inputs)
        assert torch.equal(lab, labels) and torch.equal(model.rope_cache, rope)

        total = local_sum.detach().clone()
        dist.all_reduce(total)
        loss = total.item() / tokens
        grad_dev, grads = 0.0, {}
        for n, p in model.named_parameters():
            grad = p.grad.clone()
            dist.all_reduce(grad)
            grad /= cp
            grads[n] = grad
            grad_dev = max(grad_dev, (grad - ref_grads[n]).abs().max().item())
            torch.testing.assert_close(grad, ref_grads[n], rtol=1e-5, atol=1e-6, msg=n)
        loss_rel = abs(loss - ref_loss) / abs(ref_loss)
        assert loss_rel < 1e-5, (rotate, balance, loss, ref_loss)
        name = f"{rotate}{'' if balance else '_nolb'}"
        saved[name] = {"loss": loss, "grads": cpu(grads)}
        results[name] = {"loss_rel": loss_rel, "grad_abs": grad_dev, "seconds": round(seconds, 3)}

    # SDPA outside the context is plain local attention again.
    again, _ = reference()
    assert again == ref_loss, (again, ref_loss)

    if dist.get_rank() == 0:
        if args.save:
            torch.save(saved, args.save)
        print("CP_RESULT " + json.dumps({"cp": cp, "ref_loss": ref_loss, **results}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
