#!/usr/bin/env bash
# Call 5 (2 GPUs): where the 1B memory gaps are (snapshots: bf16 AC off both sides, our Float8 with
# every linear converted), then 1B FSDP2 Float8 (float8 all-gather + precomputed scales) side by side
# with profiler traces of step 30.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
M="--training.steps 12 --training.seq_len 8192 --profiling.enable_memory_snapshot --profiling.profile_freq 12"
B4="--compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
O="--compile.loss --optimizer.implementation compiled"
T=150 ref 1b_mem 0 $M $B4 --model.flavor 1B &
T=150 ours 1b_mem 1 $M $B4 $O &
wait
T=150 ours 1b_f8all_mem 1 $M $B4 $O --float8.enable --float8.skip_small false &
T=150 ours 1b_f8_speed 0 --training.steps 30 --training.seq_len 8192 $B4 $O --float8.enable &
wait
for run in ref_1b_mem ours_1b_mem ours_1b_f8all_mem; do memory $run 12 --top 16 --last 14; done
S="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 2"
T=150 fits 150 ref 1b_fsdp2_f8 0,1 $S --model.flavor 1B $REF_F8_FSDP $REF_PROFILE_30
T=150 fits 150 ours 1b_fsdp2_f8 0,1 $S $SAC $O $OURS_F8_FSDP --float8.skip_small false $PROFILE_30
windows 1b_fsdp2_f8
traces 1b_fsdp2_f8 30 14
pack
