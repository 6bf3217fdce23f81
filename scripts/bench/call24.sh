#!/usr/bin/env bash
# Call 24 (4 GPUs). (1) Rowwise Float8 + selective-op AC with inductor rounding like eager
# (emulate_precision_casts, pytorch/pytorch#150859) against the reference's rowwise row, 8B FSDP4,
# 30 steps. (2) 8B CP4 at 32k with NCCL_PROTO=Simple, 25 steps, profiled at step 25 (steps 11-20
# are clean; compare with calls 17/22: ours 5,966 / 5,981), exposed communication per collective.
source scripts/bench/lib.sh
card
S=$ROW_8K
T=170 fits 420 ref fsdp4_rowwise 0,1,2,3 $S $REF_F8 --quantize.linear.float8.recipe_name rowwise
T=170 fits 250 ours fsdp4_rowwise 0,1,2,3 $S --compile.loss $SAC --float8.enable --float8.recipe rowwise
for s in ref ours; do
  echo "== $s"; sed 's/\x1b\[[0-9;]*m//g' $out/logs/${s}_fsdp4_rowwise.log | grep -E "step:? +(1|10|20|30)[ /]|rror|emulate_precision" \
    | grep -v lspci | sed 's/.*\(step\)/\1/' | cut -c1-160 | head -8
done
CP="--training.steps 25 --training.seq_len 32768 --compile.enable --parallelism.context_parallel_degree 4"
P25="--profiling.enable_profiling --profiling.profile_freq 25 --profiling.profiler_warmup 2 --profiling.profiler_active 1"
NCCL_PROTO=Simple T=170 fits 100 ours cp4_simple 0,1,2,3 $CP --compile.loss $SAC $P25
grep -E "step +(10|20|25)/" $out/logs/ours_cp4_simple.log | sed 's/^\[rank0\]://' | cut -c1-150
f=/tmp/ours_cp4_simple/profile_traces/iteration_25/rank0_trace.json
[ -f $f ] && python3 scripts/trace_summary.py $f --top 12 > $out/logs/trace_ours_cp4_simple.txt 2>&1; head -24 $out/logs/trace_ours_cp4_simple.txt
pack
