#!/usr/bin/env bash
# Call 81 (2x H200): call 80's rowwise block with the column-wise cast kernels' tuned block sizes
# (both GPUs at once); then 8B FSDP2 rowwise Float8 under selective AC, the reference against
# ours (our rowwise backward with the inputs' casts, the copy-engine all-gather), one after the
# other on both GPUs.
source scripts/bench/lib.sh
card
SHOW=14
R8="--flavor 8B --batch 1 --iters 30 --top 20 --params bfloat16 --float8 --recipe rowwise --ac selective"
T=120 pair "block_step rw_tuned_g0 0 ours $R8" "block_step rw_tuned_g1 1 ours $R8"
S=$ROW_8K
T=170 fits 170 ref fsdp2_rowwise 0,1 $S $REF_F8 --quantize.linear.float8.recipe_name rowwise
T=170 fits 170 ours fsdp2_rowwise_ce 0,1 $S --compile.loss $SAC --float8.enable --float8.recipe rowwise --parallelism.fsdp_all_gather copy_engines
T=170 fits 170 ours fsdp2_rowwise 0,1 $S --compile.loss $SAC --float8.enable --float8.recipe rowwise
for r in ref_fsdp2_rowwise ours_fsdp2_rowwise_ce ours_fsdp2_rowwise; do
  echo "$r"; grep -E "step:? +(10|20|30)[ /]" $out/logs/$r.log | grep -v validation | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
done
grep -h "float8 (" $out/logs/ours_fsdp2_rowwise_ce.log | head -1 | cut -c1-300
pack
