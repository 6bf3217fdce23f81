#!/usr/bin/env bash
# Call 77 (4 GPUs): 8B PP2 x FSDP2 (Interleaved1F1B, 8 microbatches) with the default split now
# weighing the head by its FLOPs (8|9|9|6 + head; call 76's trace: rank 0 waited on rank 1's
# heavier stages), against the reference, and ours with the old split (8|9|8|7 + head) as the
# same-call control; then, if time is left, ours with the embedding table all-gathered (call 76:
# the row-sharded lookup's collectives held rank 0's compute stream for 233 ms a step).
source scripts/bench/lib.sh
card
T=150 fits 150 ours pp2 0,1,2,3 $PP2_ROW --compile.loss $SAC
T=150 fits 150 ref pp2 0,1,2,3 $PP2_ROW
T=150 fits 150 ours pp2_old_split 0,1,2,3 $PP2_ROW --compile.loss $SAC --parallelism.pipeline_parallel_split_points 8,17,25
T=150 fits 150 ours pp2_table 0,1,2,3 $PP2_ROW --compile.loss $SAC --parallelism.fsdp_sharded_embedding false
grep -h "built llama3" $out/logs/ours_pp2*.log | cut -c1-220
for r in ref_pp2 ours_pp2 ours_pp2_old_split ours_pp2_table; do
  echo "$r"; grep -E "step:? +(10|20)[ /]" $out/logs/$r.log | grep -v validation | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
done
pack
