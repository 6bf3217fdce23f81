#!/usr/bin/env bash
# Call 47 (4 GPUs): FSDP's all-gathers on the copy engines. scripts/bench/comm_overlap.py (one 8B
# block's all-gather and reduce-scatter beside its w1 matmul) under NCCL's CTA policies, with and
# without symmetric-memory buffers; then 8B FSDP4 bf16 selective AC: ours as is, ours with
# --parallelism.fsdp_all_gather copy_engines, the reference. That option was then a trial on top
# of 177deeb (NCCL's zero-CTA policy + FSDP2's set_symm_mem_for_comm), not kept; the option of
# that name now is torchtitan's own copy-engine all-gather (call 49). comm_overlap.py hung in
# this call on an iteration count the ranks computed apart (fixed for call 48).
source scripts/bench/lib.sh
card
python3 -c "import torch; from torch.distributed.fsdp import FSDPModule as M; print(torch.__version__, 'nccl', torch.cuda.nccl.version(), 'set_symm_mem_for_comm', hasattr(M, 'set_symm_mem_for_comm'))"
n=0
overlap() {
  n=$((n + 1))
  env "$@" timeout 60 torchrun --nproc_per_node 4 --rdzv_backend c10d --rdzv_endpoint=localhost:0 \
    scripts/bench/comm_overlap.py > $out/logs/overlap_$n.log 2>&1
  grep -h "^\[" $out/logs/overlap_$n.log || { echo "overlap $* failed:"; tail -3 $out/logs/overlap_$n.log; }
}
overlap NCCL_DEBUG=WARN
overlap NCCL_CTA_POLICY=1
overlap NCCL_CTA_POLICY=2
overlap NCCL_CTA_POLICY=2 SYMM=ag
overlap NCCL_CTA_POLICY=2 SYMM=ag,rs
overlap SYMM=ag,rs
S=$ROW_8K
T=150 fits 150 ours fsdp4 0,1,2,3 $S --compile.loss $SAC
T=150 fits 150 ours fsdp4_ce 0,1,2,3 $S --compile.loss $SAC --parallelism.fsdp_all_gather copy_engines
T=150 fits 150 ref fsdp4 0,1,2,3 $S
windows fsdp4
grep -E "INFO step +(1|10|20|30)/|Error|error" $out/logs/ours_fsdp4_ce.log | cut -c1-150 | tail -8
pack
