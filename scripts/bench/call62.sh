#!/usr/bin/env bash
# Call 62 (4 GPUs): two 8B FSDP4 rows with the code of 2026-11-28 (the in-place loss, the default
# since calls 50-53) and the copy-engine all-gather, each against the reference in the same call:
# bf16 with AC off; Float8 tensorwise (float8 all-gather, precomputed scales) with selective AC;
# both of ours with the copy-engine all-gather.
source scripts/bench/lib.sh
card
S=$ROW_8K
CE="--parallelism.fsdp_all_gather copy_engines"
T=140 fits 140 ours fsdp4_aco 0,1,2,3 $S --compile.loss --activation_checkpoint.mode none $CE
T=140 fits 140 ref fsdp4_aco 0,1,2,3 $S --activation_checkpoint.mode none
windows fsdp4_aco
T=140 fits 140 ref fsdp4_f8 0,1,2,3 $S $REF_F8_FSDP
T=140 fits 140 ours fsdp4_f8 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP $CE
windows fsdp4_f8
pack
