#!/usr/bin/env bash
# Call 15 (4 GPUs; prepared, not run yet): 8B CP4 at seq 32768 (steps 11-20), then the 1B rows
# after the RMSNorm change, both frameworks at once on separate GPUs (batch 2 selective AC on
# GPUs 0-1, batch 4 AC off on GPUs 2-3).
source scripts/bench/lib.sh
card
CP=$CP4_ROW
T=240 fits 480 ref cp4 0,1,2,3 $CP
T=240 fits 240 ours cp4 0,1,2,3 $CP --compile.loss $SAC
windows cp4
export CONFIG_FILE=train_configs/llama3_1b.toml
S=$ROW_8K
if (( DEADLINE - $(date +%s) > 130 )); then
  T=120 ref 1b_sac 0 $S --model.flavor 1B --training.local_batch_size 2 &
  T=120 ours 1b_sac 1 $S --compile.loss $SAC --training.local_batch_size 2 &
  T=120 ref 1b_acoff 2 $S --model.flavor 1B --training.local_batch_size 4 --activation_checkpoint.mode none &
  T=120 ours 1b_acoff 3 $S --compile.loss --training.local_batch_size 4 --activation_checkpoint.mode none &
  wait
  windows 1b_sac
  windows 1b_acoff
fi
pack
