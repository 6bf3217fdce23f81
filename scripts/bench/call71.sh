#!/usr/bin/env bash
# Call 71 (4 GPUs): why our float8 backward bought 8 % of the 8B Float8 block but 0.5 % of the
# FSDP trainer (finding 25). First one compiled 8B block per GPU, all four at once, with FSDP's
# bf16 parameters (no autocast) under selective AC: ours, ours with torchao's backward, the
# reference's, and ours with fp32 parameters under autocast (call 68's setting, the control).
# Then 8B FSDP4 Float8 tensorwise selective AC (float8 all-gather, precomputed scales) with the
# step-30 profiler on both sides, one after the other; both sides' rank-0 traces come back gzipped.
source scripts/bench/lib.sh
card
SHOW=8
B8="--float8 --flavor 8B --batch 1 --ac selective --iters 30 --top 60"
T=170 block_step 8b_bf16p_ours 0 ours $B8 --params bfloat16 &
T=170 block_step 8b_bf16p_torchao 1 ours $B8 --params bfloat16 --torchao-backward &
T=170 block_step 8b_bf16p_ref 2 ref $B8 --params bfloat16 &
T=170 block_step 8b_fp32p_ours 3 ours $B8 &
wait
S=$ROW_8K
T=150 fits 320 ref fsdp4_f8 0,1,2,3 $S $REF_F8_FSDP $REF_PROFILE_30
T=150 fits 160 ours fsdp4_f8 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP $PROFILE_30
windows fsdp4_f8
traces fsdp4_f8 30 40
for s in ref ours; do
  f=/tmp/${s}_fsdp4_f8/profile_traces/iteration_30/rank0_trace.json
  [ -f $f ] && gzip -c $f > $out/trace_${s}_fsdp4_f8.json.gz
done
ls -la $out
pack
