"""How much an FSDP collective slows the matmul it overlaps, by NCCL setting.

Run under torchrun on one host; NCCL reads NCCL_MAX_CTAS, NCCL_CTA_POLICY etc. from the
environment, SYMM=ag,rs puts the all-gather's / reduce-scatter's buffers in NCCL symmetric
memory (as FSDP2's ``set_symm_mem_for_comm`` does), and CE=1 all-gathers with torchtitan's
copy-engine all-gather (run from the repository root with it on PYTHONPATH), e.g.
    NCCL_CTA_POLICY=2 SYMM=ag torchrun --nproc_per_node 4 benchmarks/tools/comm_overlap.py
Shapes are those of one Llama 3 8B block under FSDP4 at 8,192 tokens: the bf16 all-gather of a
block's weights, the fp32 reduce-scatter of its gradients, and the w1 matmul. Rank 0 prints the
matmul's TFLOP/s alone and beside each collective, and each collective's bus bandwidth alone and
beside the matmuls.
"""

import os

import torch
import torch.distributed as dist

BLOCK_PARAMS = 218_112_000  # one 8B block: attention 4096*(4096+1024+1024+4096), MLP, norms
TOKENS, DIM, HIDDEN = 8192, 4096, 14336


def buffer(numel, dtype, device, symmetric):
    if not symmetric:
        return torch.randn(numel, device=device, dtype=dtype)
    import torch.distributed._symmetric_memory as symm_mem

    with torch.cuda.use_mem_pool(symm_mem.get_mem_pool(device)):
        tensor = torch.randn(numel, device=device, dtype=dtype)
    symm_mem.rendezvous(tensor, group=dist.group.WORLD.group_name)
    return tensor


def timed(stream, fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        for _ in range(iters):
            fn()
        end.record()
    return start, end


def run(main_stream, side, mm, mm_iters, comm, comm_iters):
    """Seconds of the matmul loop and of the collective loop, started together."""
    dist.barrier()
    torch.cuda.synchronize()
    events = {}
    if comm_iters:
        events["comm"] = timed(side, comm, comm_iters)
    if mm_iters:
        events["mm"] = timed(main_stream, mm, mm_iters)
    torch.cuda.synchronize()
    return {name: start.elapsed_time(end) / 1e3 for name, (start, end) in events.items()}


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    symmetric = set(filter(None, os.environ.get("SYMM", "").split(",")))
    if symmetric:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.set_backend("NCCL")
        dist.barrier()
    shard = BLOCK_PARAMS // world
    ag_out = buffer(shard * world, torch.bfloat16, device, "ag" in symmetric)
    if os.environ.get("INPLACE", "1") == "1":  # as FSDP2 gathers
        ag_in = ag_out[rank * shard : (rank + 1) * shard]
    else:
        ag_in = buffer(shard, torch.bfloat16, device, "ag" in symmetric)
    gather = lambda: dist.all_gather_into_tensor(ag_out, ag_in)  # noqa: E731
    if os.environ.get("CE") == "1":  # torchtitan's copy-engine all-gather, as FSDP calls it
        from torchtitan.experimental.copy_engine_all_gather import CopyEngineAllGather

        comm = CopyEngineAllGather(dist.group.WORLD)
        ag_out = comm.allocate((shard * world,), dtype=torch.bfloat16, device=device)
        ag_in = ag_out[rank * shard : (rank + 1) * shard]
        gather = lambda: comm(ag_out, ag_in, dist.group.WORLD)  # noqa: E731
    rs_in = buffer(shard * world, torch.float32, device, "rs" in symmetric)
    rs_out = buffer(shard, torch.float32, device, "rs" in symmetric)
    x = torch.randn(TOKENS, DIM, device=device, dtype=torch.bfloat16)
    w = torch.randn(DIM, HIDDEN, device=device, dtype=torch.bfloat16)
    collectives = {
        "all-gather": (gather, ag_out.nbytes),
        "reduce-scatter": (lambda: dist.reduce_scatter_tensor(rs_out, rs_in), rs_in.nbytes),
    }

    def mm():
        torch.mm(x, w)

    main_stream, side = torch.cuda.current_stream(), torch.cuda.Stream()
    for _ in range(3):  # warm-up: NCCL connections, cuBLAS heuristics
        mm()
        for fn, _ in collectives.values():
            fn()
    torch.cuda.synchronize()
    flops = 2 * TOKENS * DIM * HIDDEN
    line = [f"matmul alone {flops * 50 / run(main_stream, side, mm, 50, None, 0)['mm'] / 1e12:.0f}"]
    for name, (fn, nbytes) in collectives.items():
        moved = (world - 1) / world * nbytes  # bus bytes, as nccl-tests counts them
        alone = run(main_stream, side, mm, 0, fn, 20)["comm"] / 20
        # the collectives outlast the matmuls: every matmul runs beside one
        iters = torch.tensor([max(20, int(0.2 / alone))], device=device)
        dist.all_reduce(iters, op=dist.ReduceOp.MAX)  # every rank must issue as many
        beside = run(main_stream, side, mm, 50, fn, int(iters))["mm"]
        # the matmuls outlast the collectives
        comm_beside = run(main_stream, side, mm, 800, fn, 10)["comm"] / 10
        line.append(
            f"{name}: {moved / alone / 1e9:.0f} GB/s alone, {moved / comm_beside / 1e9:.0f} "
            f"beside matmuls; matmul beside it {flops * 50 / beside / 1e12:.0f} TFLOP/s"
        )
    if rank == 0:
        setting = " ".join(
            f"{key}={os.environ[key]}"
            for key in ("NCCL_MAX_CTAS", "NCCL_CTA_POLICY", "SYMM", "INPLACE", "CE")
            if os.environ.get(key)
        )
        print(f"[{setting or 'defaults'}] " + "; ".join(line), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
