#!/usr/bin/env bash
# Call 46 (4 GPUs): does capping NCCL's CTAs (SMs) speed up the matmuls that FSDP's collectives
# overlap? First scripts/bench/comm_overlap.py (one 8B block's all-gather + reduce-scatter beside
# its w1 matmul) under several NCCL_MAX_CTAS, with NCCL's default channel count from its log; then
# 8B FSDP4 bf16 selective AC: ours as is, ours with NCCL_MAX_CTAS=8, the reference.
# It ran comm_overlap.py's first version, which timed the all-gather and reduce-scatter as one loop
# and printed one line ("NCCL_MAX_CTAS=...: matmul alone ..."); the grep below matched that line.
source scripts/bench/lib.sh
card
overlap() {
  timeout 60 torchrun --nproc_per_node 4 --rdzv_backend c10d --rdzv_endpoint=localhost:0 \
    scripts/bench/comm_overlap.py > $out/logs/overlap_${NCCL_MAX_CTAS:-default}.log 2>&1
  grep -h "NCCL_MAX_CTAS=" $out/logs/overlap_${NCCL_MAX_CTAS:-default}.log
}
NCCL_DEBUG=INFO overlap
grep -ohE "[0-9]+ coll channels|Channel [0-9]+/[0-9]+|nChannels [0-9]+" $out/logs/overlap_default.log | sort | uniq -c | tail -4
for c in 16 8 4 2; do NCCL_MAX_CTAS=$c overlap; done
S=$ROW_8K
T=150 fits 150 ours fsdp4 0,1,2,3 $S --compile.loss $SAC
NCCL_MAX_CTAS=8 T=150 fits 150 ours fsdp4_cta8 0,1,2,3 $S --compile.loss $SAC
T=150 fits 150 ref fsdp4 0,1,2,3 $S
windows fsdp4
grep -E "INFO step +(10|20|30)/" $out/logs/ours_fsdp4_cta8.log | cut -c1-150
pack
