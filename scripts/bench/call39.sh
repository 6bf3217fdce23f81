#!/usr/bin/env bash
# Call 39 (4 GPUs): rows not re-measured since FSDP stopped casting the blocks' arguments
# (call 36): 8B CP4 at seq 32768 (20 steps, steps 11-20), 8B FSDP4 Float8 (tensorwise, float8
# all-gather, precomputed scales) with selective AC, then, if time is left, the 1B AC-off rows
# (bf16 and Float8 tensorwise, batch 4), one GPU each, concurrently. No kernel tuning.
source scripts/bench/lib.sh
card
CP=$CP4_ROW
T=170 fits 170 ours cp4 0,1,2,3 $CP --compile.loss $SAC
T=150 fits 150 ref cp4 0,1,2,3 $CP
windows cp4
S=$ROW_8K
T=150 fits 150 ours fsdp4_f8 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP
T=150 fits 150 ref fsdp4_f8 0,1,2,3 $S $REF_F8_FSDP
windows fsdp4_f8
if (( DEADLINE - $(date +%s) > 150 )); then
  (export CONFIG_FILE=train_configs/llama3_1b.toml
  A="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
  T=150 ref 1b_aco 0 $A --model.flavor 1B &
  T=150 ours 1b_aco 1 $A --compile.loss &
  T=150 ref 1b_f8 2 $A --model.flavor 1B $REF_F8 &
  T=150 ours 1b_f8 3 $A --compile.loss --float8.enable &
  wait)
  for r in 1b_aco 1b_f8; do windows $r; done
fi
pack
