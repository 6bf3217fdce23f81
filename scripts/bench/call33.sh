#!/usr/bin/env bash
# Call 33 (4 GPUs).
# 1. tests/gpu/test_async_tp.py on GPUs 0,1 with the new pre-pass (torchtitan/parallel/
#    async_tp_graph.py): the all-gathers fused at local batch 1 too, values held to the plain
#    block's; concurrently, memory snapshots of the 1B Float8 row (batch 4, AC off, step 12) on
#    GPUs 2 (reference) and 3 (ours), for our +0.18 GiB.
# 2. 8B FSDP2xTP2 bf16 selective AC: ours with async TP (batch-1 all-gathers now fused), the
#    reference, ours without async TP.
source scripts/bench/lib.sh
card
gpu_test async_tp 0,1 tests/gpu/test_async_tp.py &
(export CONFIG_FILE=train_configs/llama3_1b.toml
 M="--training.steps 12 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none --profiling.enable_memory_snapshot --profiling.profile_freq 12"
 T=170 ref 1b_f8_mem 2 $M --model.flavor 1B $REF_F8 &
 T=170 ours 1b_f8_mem 3 $M --compile.loss --float8.enable &
 wait)
wait
grep -E "ASYNC_TP_RESULT|^(sync|async)|passed|failed|Error" $out/logs/async_tp.log | cut -c1-220 | head -24
for run in ref_1b_f8_mem ours_1b_f8_mem; do memory $run 12 --top 16 --last 14; done
S="--training.steps 30 --training.seq_len 8192 --compile.enable --parallelism.tensor_parallel_degree 2"
T=170 fits 170 ours fsdp2tp2_async 0,1,2,3 $S --compile.loss $SAC --parallelism.enable_async_tensor_parallel
T=170 fits 170 ref fsdp2tp2 0,1,2,3 $S
T=170 fits 170 ours fsdp2tp2 0,1,2,3 $S --compile.loss $SAC
windows fsdp2tp2
echo fsdp2tp2_async; grep -E "step +(10|20|30)/" $out/logs/ours_fsdp2tp2_async.log 2>/dev/null | sed 's/^\[rank0\]://' | cut -c1-150
grep -iE "error|Traceback" $out/logs/ours_fsdp2tp2_async.log | head -3
pack
