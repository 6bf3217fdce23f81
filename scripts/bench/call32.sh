#!/usr/bin/env bash
# Call 32 (4 GPUs, the session's last device minutes): what async TP buys on Float8. 8B FSDP2xTP2
# Float8 (tensorwise, float8 all-gather, precomputed scales; ours: shard scales), selective AC:
# ours without and with --parallelism.enable_async_tensor_parallel, then the reference.
source scripts/bench/lib.sh
card
S="--training.steps 30 --training.seq_len 8192 --compile.enable --parallelism.tensor_parallel_degree 2"
T=125 fits 250 ours fsdp2tp2_f8 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP
T=125 fits 125 ours fsdp2tp2_f8_async 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP --parallelism.enable_async_tensor_parallel
T=125 fits 110 ref fsdp2tp2_f8 0,1,2,3 $S $REF_F8_FSDP
windows fsdp2tp2_f8
grep -E "step +(10|20|30)/" $out/logs/ours_fsdp2tp2_f8_async.log | sed 's/^\[rank0\]://' | cut -c1-150
pack
