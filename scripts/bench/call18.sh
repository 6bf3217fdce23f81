#!/usr/bin/env bash
# Call 18 (4 GPUs): 8B FSDP2xTP2 Float8 with our new default (plain TP styles) against the
# reference; 8B FSDP4 bf16 AC off; the 1B rows (one GPU each, both frameworks at once: batch 2
# selective AC on GPUs 0-1, batch 4 AC off on GPUs 2-3); 8B FSDP2xTP2 bf16 if time is left.
source scripts/bench/lib.sh
card
S=$ROW_8K
TP2="--parallelism.tensor_parallel_degree 2"
T=150 fits 420 ref fsdp2tp2_f8 0,1,2,3 $S $TP2 $REF_F8_FSDP
T=150 fits 350 ours fsdp2tp2_f8 0,1,2,3 $S $TP2 --compile.loss $SAC $OURS_F8_FSDP
T=150 fits 290 ref fsdp4_acoff 0,1,2,3 $S --activation_checkpoint.mode none
T=150 fits 230 ours fsdp4_acoff 0,1,2,3 $S --compile.loss --activation_checkpoint.mode none
if (( DEADLINE - $(date +%s) > 120 )); then
  (export CONFIG_FILE=train_configs/llama3_1b.toml
  T=110 ref 1b_sac 0 $S --model.flavor 1B --training.local_batch_size 2 &
  T=110 ours 1b_sac 1 $S --compile.loss $SAC --training.local_batch_size 2 &
  T=110 ref 1b_acoff 2 $S --model.flavor 1B --training.local_batch_size 4 --activation_checkpoint.mode none &
  T=110 ours 1b_acoff 3 $S --compile.loss --training.local_batch_size 4 --activation_checkpoint.mode none &
  wait)
fi
T=150 fits 140 ref fsdp2tp2 0,1,2,3 $S $TP2
T=150 fits 70 ours fsdp2tp2 0,1,2,3 $S $TP2 --compile.loss $SAC
for r in fsdp2tp2_f8 fsdp4_acoff 1b_sac 1b_acoff fsdp2tp2; do windows $r; done
grep -hE "float8 \+ TP" $out/logs/ours_fsdp2tp2_f8.log | cut -c1-120
pack
