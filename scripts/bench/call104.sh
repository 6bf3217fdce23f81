#!/usr/bin/env bash
# Call 104 (one H200): #14's 1B selective-AC bf16 row (batch 2) on the current code, last
# measured in call 57 (before finding 23 and the in-place loss became what `--compile.loss` runs).
# Reference and ours one after the other on one GPU in the order A B B A, so both orders count.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
SAC2="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 2"
T=115 fits 115 ref sac_a 0 $SAC2 --model.flavor 1B
T=105 fits 105 ours sac_a 0 $SAC2 --compile.loss $SAC
T=105 fits 105 ours sac_b 0 $SAC2 --compile.loss $SAC
T=115 fits 115 ref sac_b 0 $SAC2 --model.flavor 1B
windows sac_a
windows sac_b
pack
