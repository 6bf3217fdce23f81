#!/usr/bin/env bash
# Call 34 (4 GPUs): memory snapshots of 8B FSDP4 bf16 selective AC on both sides (step 12), for our
# +0.07 GiB; then 8B PP2 (Interleaved1F1B, 8 microbatches) x FSDP2 side by side (last measured in
# call 21, before --compile.reorder_collectives).
source scripts/bench/lib.sh
card
M="--training.steps 12 --training.seq_len 8192 --compile.enable --profiling.enable_memory_snapshot --profiling.profile_freq 12"
T=150 fits 150 ref fsdp4_mem 0,1,2,3 $M
T=150 fits 150 ours fsdp4_mem 0,1,2,3 $M --compile.loss $SAC
for run in ref_fsdp4_mem ours_fsdp4_mem; do memory $run 12 --top 18 --last 10; done
PP=$PP2_ROW
T=150 fits 150 ref pp2 0,1,2,3 $PP
T=150 fits 150 ours pp2 0,1,2,3 $PP --compile.loss $SAC
windows pp2
pack
