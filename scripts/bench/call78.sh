#!/usr/bin/env bash
# Call 78 (4 GPUs): call 77's PP2 pair in the other order (the reference first), on a fresh
# machine; then 8B FSDP4 rowwise Float8 under selective AC, ours with the copy-engine all-gather
# (rowwise all-gathers bf16 weights), against the reference.
source scripts/bench/lib.sh
card
T=150 fits 150 ref pp2 0,1,2,3 $PP2_ROW
T=150 fits 150 ours pp2 0,1,2,3 $PP2_ROW --compile.loss $SAC
for r in ref_pp2 ours_pp2; do
  echo "$r"; grep -E "step:? +(10|20)[ /]" $out/logs/$r.log | grep -v validation | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
done
S=$ROW_8K
T=135 fits 135 ref fsdp4_rowwise 0,1,2,3 $S $REF_F8 --quantize.linear.float8.recipe_name rowwise
T=135 fits 135 ours fsdp4_rowwise_ce 0,1,2,3 $S --compile.loss $SAC --float8.enable --float8.recipe rowwise --parallelism.fsdp_all_gather copy_engines
for r in ref_fsdp4_rowwise ours_fsdp4_rowwise_ce; do
  echo "$r"; grep -E "step:? +(10|20|30)[ /]" $out/logs/$r.log | grep -v validation | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
done
pack
