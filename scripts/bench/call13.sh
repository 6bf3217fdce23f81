#!/usr/bin/env bash
# Call 13 (4 GPUs; prepared, not run yet): 8B FSDP2xTP2 Float8 (tensorwise, float8 all-gather,
# precomputed scales, selective AC): the reference (whose v0.2.2 keeps plain TP styles with this
# converter name) against ours with torchao's float8 TP styles and with the plain ones.
source scripts/bench/lib.sh
card
S="--training.steps 30 --training.seq_len 8192 --compile.enable --parallelism.tensor_parallel_degree 2"
T=150 fits 300 ref fsdp2tp2_f8 0,1,2,3 $S $REF_F8_FSDP
T=150 fits 200 ours fsdp2tp2_f8 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP
T=150 fits 100 ours fsdp2tp2_f8_plain_tp 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP --float8.tp_float8_all_gather false
windows fsdp2tp2_f8
grep -E "step +(10|20|30)/" $out/logs/ours_fsdp2tp2_f8_plain_tp.log | sed 's/^\[rank0\]://' | cut -c1-150
grep -hE "float8 \+ TP|Applied .*Tensor Parallelism" $out/logs/*fsdp2tp2*.log | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-160
pack
