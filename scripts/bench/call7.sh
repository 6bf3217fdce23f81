#!/usr/bin/env bash
# Call 7 (2 GPUs): 1B FSDP2, Float8 (float8 all-gather + precomputed scales, every linear) and bf16,
# side by side, with profiler traces of step 30 (compare the steps 11-20 window: no profiler there).
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
S="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 2"
T=140 fits 140 ref 1b_fsdp2_f8 0,1 $S --model.flavor 1B $REF_F8_FSDP $REF_PROFILE_30
T=140 fits 140 ours 1b_fsdp2_f8 0,1 $S --compile.loss $SAC $OURS_F8_FSDP --float8.skip_small false $PROFILE_30
T=140 fits 140 ref 1b_fsdp2_bf16 0,1 $S --model.flavor 1B
T=140 fits 140 ours 1b_fsdp2_bf16 0,1 $S --compile.loss $SAC
windows 1b_fsdp2_f8
windows 1b_fsdp2_bf16
traces 1b_fsdp2_f8 30 14
pack
