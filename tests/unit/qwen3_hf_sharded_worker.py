"""One rank of test_qwen3_hf_interop.py's sharded check: Qwen3 models built by the trainer's
composition (``build_model_parts``) in several layouts load an HF folder with ``load_hf_weights``
(what ``--checkpoint.initial_load_in_hf`` runs), and every rank's full state dict equals the
expected one.

    torchrun --nproc_per_node N qwen3_hf_sharded_worker.py MOE_DIR MOE_PT TIED_DIR TIED_PT

MOE_ARGV / TIED_ARGV are the model options the folders were written for. Prints
``rank R LAYOUT ok N <placements of the first expert weight>`` per layout.
"""

from __future__ import annotations

import gc
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from torchtitan.checkpoint.hf_load import load_hf_weights
from torchtitan.config import parse_args
from torchtitan.model_build import build_model_parts
from torchtitan.models import model_args_from_config
from torchtitan.parallel.dims import ParallelDims

SMALL = ["--model.dim=64", "--model.n_heads=4", "--model.n_kv_heads=2", "--model.n_layers=2"]
SMALL += ["--training.seq_len=32", "--metrics.enable_tensorboard=false"]
MOE_ARGV = ["--model.name=qwen3", "--model.flavor=debugmodel_moe", *SMALL]
TIED_ARGV = ["--model.name=qwen3", "--model.flavor=debugmodel_tied", *SMALL]
EP = "--parallelism.expert_parallel_degree"
LAYOUTS = {  # name: (world sizes, model, parallelism)
    "moe_ep2_fsdp": ((2, 4), "moe", [f"{EP}=2"]),
    "moe_tp2_ep2": ((2,), "moe", ["--parallelism.tensor_parallel_degree=2", f"{EP}=2"]),
    "moe_ep4": ((4,), "moe", [f"{EP}=4"]),
    "moe_pp2": ((2,), "moe", ["--parallelism.pipeline_parallel_degree=2"]),
    "tied_fsdp": ((2, 4), "tied", []),
}


def build(argv: list[str], world: int):
    cfg = parse_args(argv)
    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    dims = ParallelDims.from_config(cfg.parallelism, world)
    dims.build_mesh("cpu")
    if args.moe is not None and (dims.ep > 1 or dims.tp > 1):
        dims.moe_meshes()
    parts, _, _ = build_model_parts(cfg, args, dims, torch.device("cpu"), None)
    return parts, args


def expert_placements(part) -> str:
    for name, p in part.named_parameters():
        if name.endswith("experts.w1") and isinstance(p, DTensor):
            return f"{p.device_mesh.mesh_dim_names} {p.placements}"
        if name.endswith("experts.w1"):
            return "plain"
    return "-"


def main() -> None:
    moe_dir, moe_expected, tied_dir, tied_expected = sys.argv[1:5]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    folders = {
        "moe": (MOE_ARGV, moe_dir, torch.load(moe_expected)),
        "tied": (TIED_ARGV, tied_dir, torch.load(tied_expected)),
    }
    for layout, (worlds, kind, parallelism) in LAYOUTS.items():
        if world not in worlds:
            continue
        model_argv, hf_dir, expected = folders[kind]
        parts, args = build([*model_argv, *parallelism], world)
        load_hf_weights(parts, hf_dir, args)
        full = get_model_state_dict(parts[0], options=StateDictOptions(full_state_dict=True))
        # a pipeline stage holds some of the tensors; every other layout all of them
        whole = "_pp" not in layout
        assert full.keys() == expected.keys() if whole else full.keys() < expected.keys(), layout
        for k, v in full.items():
            assert torch.equal(v.float(), expected[k]), (layout, k)
        print(f"rank {rank} {layout} ok {len(full)} {expert_placements(parts[0])}", flush=True)
        del parts
        gc.collect()
    dist.destroy_process_group()
    gc.collect()


if __name__ == "__main__":
    main()
