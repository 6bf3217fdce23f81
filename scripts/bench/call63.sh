#!/usr/bin/env bash
# Call 63 (2 GPUs): the 1B selective-AC row (batch 2) with --compile.tune_kernels beside the
# reference, one GPU each, concurrently, then again with the GPUs swapped (as call 57 untuned).
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
SAC2="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 2"
T=200 pair "ours sac_g0 0 $SAC2 --compile.loss $SAC --compile.tune_kernels" "ref sac_g1 1 $SAC2 --model.flavor 1B"
T=200 pair "ours sac_g1 1 $SAC2 --compile.loss $SAC --compile.tune_kernels" "ref sac_g0 0 $SAC2 --model.flavor 1B"
for r in sac_g0 sac_g1; do windows $r; done
pack
