#!/usr/bin/env bash
# Call 48 (4 GPUs): 8B CP4 at seq 32768 at our best settings (--compile.tune_kernels, with the
# sharded embedding now the default) against the reference; then, if time is left,
# scripts/bench/comm_overlap.py under NCCL's efficiency CTA policy and, with NCCL's log, the
# symmetric-memory all-gather that failed in call 47 ("Cuda failure 'invalid argument'"), in
# place and out of place.
source scripts/bench/lib.sh
card
CP=$CP4_ROW
T=240 fits 240 ours cp4_tuned 0,1,2,3 $CP --compile.loss --compile.tune_kernels $SAC
T=200 fits 200 ref cp4 0,1,2,3 $CP
for s in ref_cp4 ours_cp4_tuned; do echo $s; grep -E "step:? +(10|20)[ /]" $out/logs/$s.log | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150; done
n=0
overlap() {
  n=$((n + 1))
  env "$@" timeout 45 torchrun --nproc_per_node 4 --rdzv_backend c10d --rdzv_endpoint=localhost:0 \
    scripts/bench/comm_overlap.py > $out/logs/overlap_$n.log 2>&1
  grep -h "^\[" $out/logs/overlap_$n.log || { echo "overlap $* failed:"; grep -E "NCCL WARN|Error|failure" $out/logs/overlap_$n.log | sort | uniq -c | head -8; }
}
fits 50 overlap NCCL_DEBUG=WARN
fits 50 overlap NCCL_CTA_POLICY=1
fits 50 overlap NCCL_DEBUG=INFO NCCL_CTA_POLICY=2 SYMM=ag INPLACE=0
fits 50 overlap NCCL_DEBUG=INFO NCCL_CTA_POLICY=2 SYMM=ag
pack
