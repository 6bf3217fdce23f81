"""Parallelize your own model with torchtitan's helpers: TP/SP + AC (+ compile) + FSDP2.

The model below is a small GPT-2-style transformer, deliberately *not* Llama: pre-LayerNorm
blocks (with biases) held in ``model.blocks`` (an ``nn.ModuleList``), learned position
embeddings, a fused qkv projection and a GELU MLP. None of its module names match Llama's, so it
brings its own tensor-parallel plan and tells every helper where its blocks live
(``blocks_attr="blocks"``).

Run it as the single-process reference, then as 2 (data parallel) x 2 (tensor parallel):

    python examples/parallelize_custom_model.py --out ref.json
    torchrun --standalone --nproc_per_node=4 examples/parallelize_custom_model.py \
        --tp 2 --ac selective --out dp2_tp2.json

Both write the same per-step losses (up to float rounding): every layout starts from the same
weights and trains on the same global batch. ``tests/distributed/test_custom_model_example.py``
checks exactly that. ``docs/parallelism.md`` explains each step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
)

from torchtitan.optim import clip_grad_norm
from torchtitan.parallel import apply_ac, apply_compile, apply_fsdp, apply_tp

# --------------------------------------------------------------------------------------- model


@dataclass
class GPTConfig:
    vocab_size: int = 256
    max_seq_len: int = 64
    dim: int = 64
    n_heads: int = 4
    n_layers: int = 2
    mlp_ratio: int = 4

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class SelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        # One fused projection whose output features are laid out *head by head*:
        # [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]. A column-wise (output-feature) shard of this weight
        # therefore holds whole heads with their q, k and v, so ColwiseParallel works as is.
        # (A [Q | K | V] layout would hand rank 0 all of Q and half of K instead.)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        # -1, not n_heads: under tensor parallelism this rank holds only n_heads / tp heads.
        qkv = self.qkv(x).view(bs, seqlen, -1, 3 * self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.chunk(3, dim=-1))  # (bs, heads, seq, hd)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(bs, seqlen, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc_in = nn.Linear(cfg.dim, cfg.mlp_ratio * cfg.dim)
        self.fc_out = nn.Linear(cfg.mlp_ratio * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.dim)  # token embedding
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.dim)  # learned position embedding
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.dim)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)  # not tied to wte

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (bs, seqlen) -> logits (bs, seqlen, vocab)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 init; projections into the residual stream are scaled down with depth."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("ln_f"):
                nn.init.ones_(p)
            else:
                std = 0.02
                if name.endswith(("attn.proj.weight", "mlp.fc_out.weight")):
                    std /= math.sqrt(2 * self.cfg.n_layers)
                nn.init.normal_(p, mean=0.0, std=std)


# ----------------------------------------------------------------- the tensor-parallel plan
#
# Between blocks the residual stream is sharded on the sequence (Shard(1)): the LayerNorms run
# sequence-parallel on their shard, each sub-layer all-gathers the sequence on entry
# (PrepareModuleInput) and its row-wise output projection reduce-scatters back to Shard(1).
# Column-wise layers keep their local output (a plain tensor holding this rank's heads or MLP
# features), which is why attention views with -1 heads.


def gpt_block_plan() -> dict[str, ParallelStyle]:
    gather_sequence = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
    )
    return {
        "ln1": SequenceParallel(),
        "attn": gather_sequence,
        "attn.qkv": ColwiseParallel(),  # local heads (see the qkv layout above)
        "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
        "ln2": SequenceParallel(),
        "mlp": gather_sequence,
        "mlp.fc_in": ColwiseParallel(),
        "mlp.fc_out": RowwiseParallel(output_layouts=Shard(1)),
    }


def gpt_root_plan() -> dict[str, ParallelStyle]:
    # Both embeddings are row-wise (their tables are sharded over rows) and reduce-scatter their
    # output to Shard(1), so the two local sequence shards line up and add as plain tensors.
    embed = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    return {
        "wte": embed,
        "wpe": embed,
        "ln_f": SequenceParallel(),
        # Logits stay sharded on the vocabulary, as a DTensor: the loss runs in loss_parallel().
        "lm_head": ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False
        ),
    }


# ---------------------------------------------------------------------------- parallelizing


def parallelize(
    model: TinyGPT,
    mesh: DeviceMesh | None,
    ac_mode: str,
    compile_blocks: bool,
) -> None:
    """TP -> AC -> compile -> FSDP, the order torchtitan's ``parallelize_llama`` uses."""
    tp = mesh["tp"].size() if mesh is not None else 1
    dp = mesh["dp"].size() if mesh is not None else 1
    if tp > 1:
        apply_tp(model, mesh["tp"], gpt_root_plan(), gpt_block_plan(), blocks_attr="blocks")
    apply_ac(model, ac_mode, blocks_attr="blocks")
    if compile_blocks:
        apply_compile(model, blocks_attr="blocks")
    if dp > 1:
        # fp32 here so the run matches the fp32 reference; bf16 params are the GPU default.
        apply_fsdp(
            model,
            mesh["dp"],
            param_dtype=torch.float32,
            reduce_dtype=torch.float32,
            blocks_attr="blocks",
            input_group=("wte", "wpe"),
            output_group=("ln_f", "lm_head"),
        )


# ------------------------------------------------------------------------------------ data


def synthetic_batch(step: int, batch: int, seq_len: int, vocab: int):
    """The same global batch for every layout. Each row follows t -> (5 t + 3) mod vocab from a
    random first token, with 1 token in 8 replaced by noise: learnable, so the loss falls.
    Returns (inputs, labels), each (batch, seq_len)."""
    g = torch.Generator().manual_seed(1000 + step)
    seq = torch.empty(batch, seq_len + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(vocab, (batch,), generator=g)
    for i in range(1, seq_len + 1):
        seq[:, i] = (5 * seq[:, i - 1] + 3) % vocab
    noise = torch.rand(batch, seq_len + 1, generator=g) < 0.125
    seq[noise] = torch.randint(vocab, (int(noise.sum()),), generator=g)
    return seq[:, :-1], seq[:, 1:]


# ------------------------------------------------------------------------------------ main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree; dp = world / tp")
    p.add_argument("--ac", default="none", choices=["none", "full", "selective"])
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="", help="write the per-step losses here as JSON")
    return p.parse_args(argv)


def main(argv=None) -> list[float]:
    args = parse_args(argv)
    cfg = GPTConfig()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    # 1. Process group and a 2-D (dp, tp) mesh; tp is the inner (fastest-varying) dimension so a
    #    TP group is made of neighbouring ranks (one node's NVLink on GPUs).
    mesh = None
    if "WORLD_SIZE" in os.environ:  # launched by torchrun
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=120))
        if world % args.tp:
            raise SystemExit(f"--tp {args.tp} must divide the world size {world}")
        mesh = init_device_mesh(
            device.type, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp")
        )
    elif args.tp != 1:
        raise SystemExit("--tp > 1 needs torchrun")
    dp = mesh["dp"].size() if mesh is not None else 1
    dp_rank = mesh["dp"].get_local_rank() if mesh is not None else 0
    tp = args.tp
    if args.global_batch % dp:
        raise SystemExit(f"--global-batch {args.global_batch} must be a multiple of dp={dp}")

    # 2. Build on the meta device (no memory), parallelize, then allocate each rank's shards.
    with torch.device("meta"):
        model = TinyGPT(cfg)
    parallelize(model, mesh, args.ac, args.compile)
    model.to_empty(device=device)

    # 3. Initial weights equal to a single-process model's: rank 0 initializes the full model
    #    with a fixed seed and every rank receives its shards. (Random init directly on DTensor
    #    shards would not reproduce the single-device weights.) TinyGPT has no buffers; a model
    #    with non-persistent buffers must recompute them after to_empty().
    full_state = {}
    if rank == 0:
        torch.manual_seed(args.seed)
        reference = TinyGPT(cfg)
        reference.init_weights()
        full_state = reference.state_dict()
    if mesh is None:
        model.load_state_dict(full_state)
    else:
        set_model_state_dict(
            model,
            full_state,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )

    # 4. Train. Each dp rank takes its slice of the global batch; FSDP averages gradients over
    #    dp, so the update is that of the whole batch. TP ranks of one dp rank share its slice.
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    local_batch = args.global_batch // dp
    losses, grad_norms = [], []
    for step in range(1, args.steps + 1):
        inputs, labels = synthetic_batch(step, args.global_batch, args.seq_len, cfg.vocab_size)
        rows = slice(dp_rank * local_batch, (dp_rank + 1) * local_batch)
        inputs, labels = inputs[rows].to(device), labels[rows].to(device)

        logits = model(inputs)
        vocab_sharded = isinstance(logits, DTensor)  # tp > 1: Shard(-1) logits
        # loss_parallel: softmax/cross-entropy reduce over the TP ranks' vocab shards instead
        # of gathering the logits; backward must run inside the context too.
        with loss_parallel() if vocab_sharded else contextlib.nullcontext():
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            loss.backward()
        grad_norm = clip_grad_norm(list(model.parameters()), max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        loss = loss.detach()
        if isinstance(loss, DTensor):  # replicated over tp
            loss = loss.full_tensor()
        if dp > 1:  # the global batch's mean loss: average the dp ranks' means
            dist.all_reduce(loss, group=mesh["dp"].get_group())
            loss /= dp
        losses.append(loss.item())
        grad_norms.append(grad_norm.item())
        if rank == 0:
            print(f"step {step}  loss {losses[-1]:.6f}  grad_norm {grad_norms[-1]:.6f}")

    if rank == 0 and args.out:
        qkv = model.blocks[0].attn.qkv.weight  # shows how the helpers laid out one weight
        layout = {
            "world_size": world,
            "dp": dp,
            "tp": tp,
            "ac": args.ac,
            "compile": args.compile,
            "qkv_weight_placements": (
                [str(p) for p in qkv.placements] if isinstance(qkv, DTensor) else None
            ),
        }
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "grad_norms": grad_norms, "layout": layout}, f, indent=1)
    if dist.is_initialized():
        dist.destroy_process_group()
    return losses


if __name__ == "__main__":
    main()
