#!/usr/bin/env bash
# Call 21 (4 GPUs): 8B FSDP2xTP2 Float8 side by side with --float8.tp_shard_scales now the
# default (no profiler on either side); 8B PP2 (Interleaved1F1B, 8 microbatches) x FSDP2.
source scripts/bench/lib.sh
card
S=$ROW_8K
TP2="--parallelism.tensor_parallel_degree 2"
T=150 fits 560 ours fsdp2tp2_f8 0,1,2,3 $S $TP2 --compile.loss $SAC $OURS_F8_FSDP
T=150 fits 420 ref fsdp2tp2_f8 0,1,2,3 $S $TP2 $REF_F8_FSDP
PP=$PP2_ROW
T=150 fits 280 ref pp2 0,1,2,3 $PP
T=150 fits 140 ours pp2 0,1,2,3 $PP --compile.loss $SAC
for r in fsdp2tp2_f8 pp2; do windows $r; done
pack
