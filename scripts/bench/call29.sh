#!/usr/bin/env bash
# Call 29 (4 GPUs): async TP in training now that the pass fuses (call 28). 8B FSDP2xTP2 bf16,
# selective AC: ours with --parallelism.enable_async_tensor_parallel, the reference, ours without;
# then ours Float8 (shard scales) with async TP if time is left.
source scripts/bench/lib.sh
card
S="--training.steps 30 --training.seq_len 8192 --compile.enable --parallelism.tensor_parallel_degree 2"
T=170 fits 170 ours fsdp2tp2_async 0,1,2,3 $S --compile.loss $SAC --parallelism.enable_async_tensor_parallel
T=170 fits 170 ref fsdp2tp2 0,1,2,3 $S
T=170 fits 170 ours fsdp2tp2 0,1,2,3 $S --compile.loss $SAC
T=170 fits 170 ours fsdp2tp2_f8_async 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP --parallelism.enable_async_tensor_parallel
windows fsdp2tp2
for r in fsdp2tp2_async fsdp2tp2_f8_async; do echo $r; grep -E "step +(10|20|30)/" $out/logs/ours_$r.log 2>/dev/null | sed 's/^\[rank0\]://' | cut -c1-150; grep -iE "error|Traceback" $out/logs/ours_$r.log | head -3; done
pack
