"""Parallelize your own model with torchtitan's helpers: PP + TP/SP + AC (+ compile) + FSDP2.

The model below is a small GPT-2-style transformer, deliberately *not* Llama: pre-LayerNorm
blocks (with biases) held in ``model.blocks`` (an ``nn.ModuleList``), learned position
embeddings, a fused qkv projection and a GELU MLP. None of its module names match Llama's, so it
brings its own tensor-parallel plan and tells every helper where its parts live
(``blocks_attr="blocks"``, its embeddings and its norm + head).

Run it as the single-process reference, then as 2 (data parallel) x 2 (tensor parallel), or as
2 (pipeline stages) x 2 (data parallel):

    python examples/parallelize_custom_model.py --out ref.json
    torchrun --standalone --nproc_per_node=4 examples/parallelize_custom_model.py \
        --tp 2 --ac selective --out dp2_tp2.json
    torchrun --standalone --nproc_per_node=4 examples/parallelize_custom_model.py \
        --pp 2 --pp-schedule 1F1B --out pp2_dp2.json

All write the same per-step losses (up to float rounding): every layout starts from the same
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
from torchtitan.parallel.blocks import block_items
from torchtitan.parallel.pipeline import (
    SINGLE_STAGE,
    build_pipeline_stage,
    build_schedule,
    build_stage_module,
    check_microbatches,
    plan_stages,
)

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
        """tokens (bs, seqlen) -> logits (bs, seqlen, vocab).

        As a pipeline stage (see ``build_stage_module``): without the embeddings (None) the input
        is the previous stage's hidden states (bs, seqlen, dim); without the norm and head it
        returns hidden states. The loop only calls the blocks, so a block of another stage (a
        placeholder that returns its input) changes nothing.
        """
        if self.wte is None:
            x = tokens
        else:
            positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
            x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        if self.ln_f is not None:
            x = self.ln_f(x)
        return x if self.lm_head is None else self.lm_head(x)

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

# Where TinyGPT keeps its parts, for the helpers that group or cut the model around them.
GPT_BLOCKS = "blocks"
GPT_INPUT_MODULES = ("wte", "wpe")  # first pipeline stage; one FSDP group
GPT_OUTPUT_MODULES = ("ln_f", "lm_head")  # last pipeline stage; one FSDP group


def mesh_size(mesh: DeviceMesh | None, name: str) -> int:
    return mesh[name].size() if mesh is not None else 1


def parallelize(
    model: TinyGPT,
    mesh: DeviceMesh | None,
    ac_mode: str,
    compile_blocks: bool,
) -> None:
    """TP -> AC -> compile -> FSDP, the order torchtitan's ``parallelize`` uses. ``model``
    may be a pipeline stage: the helpers skip the parts it lacks."""
    if mesh_size(mesh, "tp") > 1:
        apply_tp(model, mesh["tp"], gpt_root_plan(), gpt_block_plan(), GPT_BLOCKS)
    apply_ac(model, ac_mode, blocks_attr=GPT_BLOCKS)
    if compile_blocks:
        tp = mesh_size(mesh, "tp") > 1
        apply_compile(model, GPT_BLOCKS, clone_first_input=tp, reorder_collectives=tp)
    if mesh_size(mesh, "dp") > 1:
        # fp32 here so the run matches the fp32 reference; bf16 params are the GPU default.
        apply_fsdp(
            model,
            mesh["dp"],
            param_dtype=torch.float32,
            reduce_dtype=torch.float32,
            pipeline_parallel=mesh_size(mesh, "pp") > 1,
            blocks_attr=GPT_BLOCKS,
            input_group=GPT_INPUT_MODULES,
            output_group=GPT_OUTPUT_MODULES,
        )


# ----------------------------------------------------------------------- pipeline parallel


def pipeline_stage(model: TinyGPT, mesh: DeviceMesh, device, args, local_batch: int):
    """Cut this rank's stage out of the (meta) model: its share of the blocks, the embeddings
    iff first, the norm + head iff last. Parallelize it like a whole model and hand it to a
    schedule that runs it with the other pipeline ranks' stages. -> (stage, schedule, plan)."""
    pp = mesh["pp"].size()
    plan = plan_stages(model.cfg.n_layers, pp, mesh["pp"].get_local_rank(), args.pp_schedule)
    try:
        check_microbatches(args.pp_schedule, args.microbatches, pp, plan.num_stages)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if local_batch % args.microbatches:
        raise SystemExit(f"--microbatches {args.microbatches} must divide {local_batch}")
    (stage_id,) = plan.stage_ids  # GPipe and 1F1B: one stage per rank
    first, last = plan.has_first(), plan.has_last()
    stage = build_stage_module(
        model, plan.layers[stage_id], first, last, GPT_BLOCKS, GPT_INPUT_MODULES, GPT_OUTPUT_MODULES
    )
    parallelize(stage, mesh, args.ac, args.compile)
    tokens = local_batch * args.seq_len

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # Summed over the microbatch, divided by the local batch's tokens: the microbatch
        # losses (and gradients) add up to those of the local batch's mean loss.
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / tokens

    runner = build_pipeline_stage(stage, stage_id, plan, device, mesh["pp"].get_group())
    schedule = build_schedule(args.pp_schedule, [runner], args.microbatches, loss_fn)
    return stage, schedule, plan


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
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree (stages)")
    p.add_argument("--pp-schedule", default="1F1B", choices=SINGLE_STAGE)
    p.add_argument("--microbatches", type=int, default=4, help="per local batch, under --pp")
    p.add_argument("--ac", default="none", choices=["none", "full", "selective"])
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="", help="write the per-step losses here as JSON")
    return p.parse_args(argv)


def build_mesh(args: argparse.Namespace, device: torch.device) -> DeviceMesh | None:
    """A 3-D (pp, dp, tp) mesh over the torchrun processes (dp = world / (pp * tp)), or None
    in a plain single process. tp is the inner (fastest-varying) dimension, so a TP group is
    made of neighbouring ranks (one node's NVLink on GPUs); pp is the outer one."""
    if "WORLD_SIZE" not in os.environ:  # not launched by torchrun
        if args.tp != 1 or args.pp != 1:
            raise SystemExit("--tp / --pp > 1 need torchrun")
        return None
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=120)
    )
    world = dist.get_world_size()
    if world % (args.pp * args.tp):
        raise SystemExit(f"--pp {args.pp} x --tp {args.tp} must divide the world size {world}")
    shape = (args.pp, world // (args.pp * args.tp), args.tp)
    return init_device_mesh(device.type, shape, mesh_dim_names=("pp", "dp", "tp"))


def load_initial_weights(model: nn.Module, cfg: GPTConfig, seed: int, mesh) -> None:
    """Initial weights equal to a single-process model's: rank 0 initializes the full model
    with a fixed seed and every rank receives its shards of its stage's parameters. (Random
    init directly on DTensor shards would not reproduce the single-device weights.) TinyGPT has
    no buffers; a model with non-persistent buffers must recompute them after to_empty()."""
    full_state = {}
    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.manual_seed(seed)
        reference = TinyGPT(cfg)
        reference.init_weights()
        full_state = reference.state_dict()
    if mesh is None:
        model.load_state_dict(full_state)
        return
    # Not strict: the full state also holds the other pipeline stages' parameters.
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    missing = set_model_state_dict(model, full_state, options=options).missing_keys
    if missing:
        raise RuntimeError(f"initial weights lack {missing}")


def vocab_parallel_loss(vocab_sharded: bool):
    """loss_parallel: softmax/cross-entropy reduce over the TP ranks' vocab shards instead of
    gathering the logits; the backward must run inside the context too."""
    return loss_parallel() if vocab_sharded else contextlib.nullcontext()


def forward_backward(model: nn.Module, inputs, labels) -> torch.Tensor:
    """-> the local batch's mean loss (gradients accumulated)."""
    logits = model(inputs)
    with vocab_parallel_loss(isinstance(logits, DTensor)):  # tp > 1: Shard(-1) logits
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        loss.backward()
    return loss.detach()


def forward_backward_pipelined(schedule, plan, inputs, labels, tp: int) -> torch.Tensor:
    """Run every microbatch through all stages and back. -> the local batch's mean loss on the
    rank holding the last stage, 0 on the others."""
    losses: list[torch.Tensor] = []
    kwargs = dict(target=labels, losses=losses) if plan.has_last() else {}
    args = (inputs,) if plan.has_first() else ()
    with vocab_parallel_loss(tp > 1):
        schedule.step(*args, **kwargs)
    local = [x.detach().full_tensor() if isinstance(x, DTensor) else x.detach() for x in losses]
    return sum(local, torch.zeros((), device=inputs.device))


def global_mean(loss: torch.Tensor, mesh: DeviceMesh | None) -> torch.Tensor:
    """The global batch's mean loss: from the last pipeline stage (the other stages hold 0) to
    every pipeline rank, then averaged over the dp ranks' means."""
    if isinstance(loss, DTensor):  # replicated over tp
        loss = loss.full_tensor()
    if mesh_size(mesh, "pp") > 1:
        dist.all_reduce(loss, group=mesh["pp"].get_group())
    if mesh_size(mesh, "dp") > 1:
        dist.all_reduce(loss, group=mesh["dp"].get_group())
        loss /= mesh_size(mesh, "dp")
    return loss


def write_report(path: str, model: nn.Module, args, mesh, losses, grad_norms) -> None:
    """The curves and how the helpers laid out one weight (rank 0 holds the first stage)."""
    qkv = block_items(model, GPT_BLOCKS)[0][1].attn.qkv.weight
    layout = {
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "pp": mesh_size(mesh, "pp"),
        "dp": mesh_size(mesh, "dp"),
        "tp": mesh_size(mesh, "tp"),
        "pp_schedule": args.pp_schedule if mesh_size(mesh, "pp") > 1 else None,
        "stage_blocks": [i for i, _ in block_items(model, GPT_BLOCKS)],
        "ac": args.ac,
        "compile": args.compile,
        "qkv_weight_placements": (
            [str(p) for p in qkv.placements] if isinstance(qkv, DTensor) else None
        ),
    }
    with open(path, "w") as f:
        json.dump({"losses": losses, "grad_norms": grad_norms, "layout": layout}, f, indent=1)


def main(argv=None) -> list[float]:
    args = parse_args(argv)
    cfg = GPTConfig()
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    # 1. Process group and the (pp, dp, tp) mesh.
    mesh = build_mesh(args, device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    dp, tp, pp = mesh_size(mesh, "dp"), mesh_size(mesh, "tp"), mesh_size(mesh, "pp")
    dp_rank = mesh["dp"].get_local_rank() if mesh is not None else 0
    if args.global_batch % dp:
        raise SystemExit(f"--global-batch {args.global_batch} must be a multiple of dp={dp}")
    local_batch = args.global_batch // dp

    # 2. Build on the meta device (no memory), cut out this rank's pipeline stage, parallelize,
    #    then allocate this rank's shards.
    with torch.device("meta"):
        model = TinyGPT(cfg)
    schedule = plan = None
    if pp > 1:
        model, schedule, plan = pipeline_stage(model, mesh, device, args, local_batch)
    else:
        parallelize(model, mesh, args.ac, args.compile)
    model.to_empty(device=device)

    # 3. The same initial weights as the single-process run.
    load_initial_weights(model, cfg, args.seed, mesh)

    # 4. Train. Each dp rank takes its slice of the global batch; FSDP averages gradients over
    #    dp, so the update is that of the whole batch. The TP ranks and pipeline stages of one
    #    dp rank share its slice (the first stage reads the inputs, the last the labels).
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    pp_group = mesh["pp"].get_group() if pp > 1 else None
    losses, grad_norms = [], []
    for step in range(1, args.steps + 1):
        inputs, labels = synthetic_batch(step, args.global_batch, args.seq_len, cfg.vocab_size)
        rows = slice(dp_rank * local_batch, (dp_rank + 1) * local_batch)
        inputs, labels = inputs[rows].to(device), labels[rows].to(device)
        if schedule is None:
            loss = forward_backward(model, inputs, labels)
        else:
            loss = forward_backward_pipelined(schedule, plan, inputs, labels, tp)
        # The norm of the whole model's gradients: summed over the stages under pp.
        grad_norm = clip_grad_norm(list(model.parameters()), max_norm=1.0, pp_group=pp_group)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(global_mean(loss, mesh).item())
        grad_norms.append(grad_norm.item())
        if rank == 0:
            print(f"step {step}  loss {losses[-1]:.6f}  grad_norm {grad_norms[-1]:.6f}")

    if rank == 0 and args.out:
        write_report(args.out, model, args, mesh, losses, grad_norms)
    if dist.is_initialized():
        dist.destroy_process_group()
    return losses


if __name__ == "__main__":
    main()
