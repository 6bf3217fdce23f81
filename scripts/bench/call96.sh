#!/usr/bin/env bash
# Call 96 (one H200): #14's 1B AC-off bf16 row (batch 4) on the current code, the reference then
# ours on the same GPU.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=110 fits 110 ref aco 0 $ACO --model.flavor 1B
T=110 fits 110 ours aco 0 $ACO --compile.loss
windows aco
pack
