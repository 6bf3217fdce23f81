#!/usr/bin/env bash
# Call 4 (2 GPUs): the optimizer step on its own (fused vs compiled AdamW, 1B and 8B/4 shapes), 1B
# selective AC side by side with our fused and compiled optimizers, then 1B Float8 memory snapshots.
source scripts/bench/lib.sh
card
S="--training.steps 30 --training.seq_len 8192"
export CONFIG_FILE=train_configs/llama3_1b.toml
(
  for a in "--flavor 1B" "--flavor 8B --shard 4"; do
    CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$root timeout 150 python3 scripts/bench/optimizer_step.py $a > $out/logs/optim_$(echo $a | tr -dc 'A-Za-z0-9').log 2>&1
    echo "optimizer bench $a rc=$?"; cat $out/logs/optim_$(echo $a | tr -dc 'A-Za-z0-9').log | tail -6
  done
  T=200 ours 1b_sac_compiled 0 $S --compile.enable --compile.loss --training.local_batch_size 2 $SAC --optimizer.implementation compiled
) &
(
  T=200 ref 1b_sac 1 $S --model.flavor 1B --compile.enable --training.local_batch_size 2
  T=200 ours 1b_sac_fused 1 $S --compile.enable --compile.loss --training.local_batch_size 2 $SAC
) &
wait
M="--training.steps 12 --profiling.enable_memory_snapshot --profiling.profile_freq 12"
F8="--training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=150 fits 150 ref 1b_f8_mem 0 $M $F8 --model.flavor 1B $REF_F8 &
T=150 fits 150 ours 1b_f8_mem 1 $M $F8 --compile.loss --float8.enable &
wait
memory ref_1b_f8_mem 12 --top 25
memory ours_1b_f8_mem 12 --top 25
pack
