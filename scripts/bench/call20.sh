#!/usr/bin/env bash
# Call 20 (4 GPUs): 8B FSDP2xTP2 bf16 side by side (issue #14's row; the bf16 basis of the Float8
# TP rows of call 19); 8B FSDP4 bf16 AC off at local batch 2 (issue #14's "best bf16 settings");
# the 1B Float8 row (one GPU each, batch 4, AC off) with the 1B bf16 AC-off pair beside it.
source scripts/bench/lib.sh
card
S=$ROW_8K
TP2="--parallelism.tensor_parallel_degree 2"
T=160 fits 540 ref fsdp2tp2 0,1,2,3 $S $TP2
T=160 fits 400 ours fsdp2tp2 0,1,2,3 $S $TP2 --compile.loss $SAC
T=160 fits 260 ours fsdp4_acoff_b2 0,1,2,3 $S --compile.loss --activation_checkpoint.mode none --training.local_batch_size 2
if (( DEADLINE - $(date +%s) > 110 )); then
  (export CONFIG_FILE=train_configs/llama3_1b.toml
  B4="--training.local_batch_size 4 --activation_checkpoint.mode none"
  T=105 ref 1b_f8 0 $S --model.flavor 1B $B4 $REF_F8 &
  T=105 ours 1b_f8 1 $S --compile.loss $B4 --float8.enable &
  T=105 ref 1b_acoff 2 $S --model.flavor 1B $B4 &
  T=105 ours 1b_acoff 3 $S --compile.loss $B4 &
  wait)
fi
for r in fsdp2tp2 1b_f8 1b_acoff; do windows $r; done
grep -E "step +(10|20|30)/" $out/logs/ours_fsdp4_acoff_b2.log | sed 's/^\[rank0\]://' | cut -c1-150
pack
