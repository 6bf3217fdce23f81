#!/usr/bin/env bash
# Call 49 (4 GPUs): FSDP's block all-gathers on the copy engines
# (--parallelism.fsdp_all_gather copy_engines, torchtitan/parallel/copy_engine_all_gather.py).
# 8B FSDP4 bf16 selective AC: ours with it, ours without, the reference; then
# scripts/bench/comm_overlap.py with NCCL's all-gather and with ours; the GPU test (bitwise equal
# to NCCL's all-gather over 3 steps); then, if time is left, the Float8 tensorwise row with it
# against the reference.
source scripts/bench/lib.sh
card
S=$ROW_8K
CE="--parallelism.fsdp_all_gather copy_engines"
T=120 fits 120 ours fsdp4_ce 0,1,2,3 $S --compile.loss $SAC $CE
T=120 fits 120 ours fsdp4 0,1,2,3 $S --compile.loss $SAC
T=120 fits 120 ref fsdp4 0,1,2,3 $S
windows fsdp4
grep -E "INFO step +(1|10|20|30)/|rror" $out/logs/ours_fsdp4_ce.log | cut -c1-150 | tail -6
n=0
overlap() {
  n=$((n + 1))
  env PYTHONPATH=$root "$@" timeout 40 torchrun --nproc_per_node 4 --rdzv_backend c10d \
    --rdzv_endpoint=localhost:0 scripts/bench/comm_overlap.py > $out/logs/overlap_$n.log 2>&1
  grep -h "^\[" $out/logs/overlap_$n.log || { echo "overlap $* failed:"; grep -E "Error|error" $out/logs/overlap_$n.log | sort | uniq -c | head -5; }
}
fits 45 overlap NCCL_DEBUG=WARN
fits 45 overlap CE=1
T=100 fits 100 gpu_test ce_gpu_test 0,1,2,3 tests/gpu/test_copy_engine_all_gather.py
grep -E "passed|failed|same_losses|Error" $out/logs/ce_gpu_test.log | cut -c1-300 | tail -4
T=120 fits 120 ours fsdp4_f8_ce 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP $CE
T=120 fits 120 ref fsdp4_f8 0,1,2,3 $S $REF_F8_FSDP
grep -E "INFO step +(10|20|30)/|rror" $out/logs/ours_fsdp4_f8_ce.log | cut -c1-150 | tail -4
grep -E "step: +(10|20|30) " $out/logs/ref_fsdp4_f8.log | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
pack
