#!/usr/bin/env bash
# Call 9 (4 GPUs): 8B FSDP4 Float8 and bf16, selective AC, side by side with the step-30 profiler
# on both sides (the 8B Float8 gap of call 3 had no trace); then the Float8 AC-off pair if time
# is left. Brings back both sides' rank-0 Float8 traces (gzipped).
source scripts/bench/lib.sh
card
S=$ROW_8K
T=150 fits 330 ref fsdp4_f8 0,1,2,3 $S $REF_F8_FSDP $REF_PROFILE_30
T=150 fits 270 ours fsdp4_f8 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP $PROFILE_30
T=150 fits 210 ref fsdp4_bf16 0,1,2,3 $S $REF_PROFILE_30
T=150 fits 150 ours fsdp4_bf16 0,1,2,3 $S --compile.loss $SAC $PROFILE_30
windows fsdp4_f8
windows fsdp4_bf16
traces fsdp4_f8 30 25
traces fsdp4_bf16 30 12
for s in ref ours; do
  f=/tmp/${s}_fsdp4_f8/profile_traces/iteration_30/rank0_trace.json
  [ -f $f ] && gzip -c $f > $out/trace_${s}_fsdp4_f8.json.gz
done
T=150 fits 260 ref fsdp4_f8_acoff 0,1,2,3 $S $REF_F8_FSDP --activation_checkpoint.mode none
T=150 fits 110 ours fsdp4_f8_acoff 0,1,2,3 $S --compile.loss $OURS_F8_FSDP --activation_checkpoint.mode none
windows fsdp4_f8_acoff
ls -la $out
pack
