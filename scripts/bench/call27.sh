#!/usr/bin/env bash
# Call 27 (4 GPUs, short: the session's last device minutes). 8B FSDP2xTP2 Float8 (tensorwise,
# float8 all-gather, precomputed scales, shard scales), selective AC, side by side, with
# --compile.reorder_collectives now on by default (the compiled blocks hold TP's collectives).
source scripts/bench/lib.sh
card
S="--training.steps 30 --training.seq_len 8192 --compile.enable --parallelism.tensor_parallel_degree 2"
T=125 fits 240 ours fsdp2tp2_f8 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP
T=125 fits 120 ref fsdp2tp2_f8 0,1,2,3 $S $REF_F8_FSDP
windows fsdp2tp2_f8
pack
