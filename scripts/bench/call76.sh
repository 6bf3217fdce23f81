#!/usr/bin/env bash
# Call 76 (4 GPUs): where rowwise Float8's time goes, and where PP2's. First one compiled 8B block
# per GPU, all four at once, with FSDP's bf16 parameters: rowwise under selective AC, ours and the
# reference's; bf16 under selective AC (ours); rowwise with AC off (ours). Then the 8B FSDP4
# rowwise selective-AC pair with the current code (the row last ran in call 45), and 8B PP2 x
# FSDP2 (ours) with step 20 profiled; its rank-0 and rank-2 GPU activity comes back gzipped.
source scripts/bench/lib.sh
card
SHOW=12
B8="--flavor 8B --batch 1 --iters 30 --top 60 --params bfloat16"
R8="$B8 --float8 --recipe rowwise"
T=170 block_step 8b_rw_sac_ours 0 ours $R8 --ac selective &
T=170 block_step 8b_rw_sac_ref 1 ref $R8 --ac selective &
T=170 block_step 8b_bf16_sac_ours 2 ours $B8 --ac selective &
T=170 block_step 8b_rw_none_ours 3 ours $R8 &
wait
S=$ROW_8K
T=140 fits 140 ours fsdp4_rowwise 0,1,2,3 $S --compile.loss $SAC --float8.enable --float8.recipe rowwise
T=140 fits 140 ref fsdp4_rowwise 0,1,2,3 $S $REF_F8 --quantize.linear.float8.recipe_name rowwise
windows fsdp4_rowwise
PP_PROFILE="--profiling.enable_profiling --profiling.profile_freq 20 --profiling.profiler_warmup 2 --profiling.profiler_active 1"
T=160 fits 160 ours pp2 0,1,2,3 $PP2_ROW --compile.loss $SAC $PP_PROFILE
grep -E "INFO step +(10|20)/" $out/logs/ours_pp2.log | cut -c1-150
for r in 0 2; do
  f=/tmp/ours_pp2/profile_traces/iteration_20/rank${r}_trace.json
  [ -f $f ] && python3 scripts/bench/gpu_events.py $f $out/pp2_rank$r.json.gz && \
    python3 scripts/trace_summary.py $f --top 25 > $out/logs/trace_pp2_rank$r.txt 2>&1 && head -40 $out/logs/trace_pp2_rank$r.txt | cut -c1-150
done
ls -la $out
pack
