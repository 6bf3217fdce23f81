#!/usr/bin/env bash
# Call 23 (4 GPUs). (1) Where CP4's time goes: 8B CP4 at seq 32768, selective AC, both sides
# profiled at step 20 (so steps 11-20 include the profiler: compare shares, not tokens/s).
# (2) TP + compile + full AC (fixed on CPU in 7d9f0b0) on a GPU: 8B FSDP2xTP2, 10 steps.
source scripts/bench/lib.sh
card
CP=$CP4_ROW
P20="--profiling.enable_profiling --profiling.profile_freq 20 --profiling.profiler_warmup 2 --profiling.profiler_active 1"
T=170 fits 400 ours cp4 0,1,2,3 $CP --compile.loss $SAC $P20
T=170 fits 260 ref cp4 0,1,2,3 $CP $P20 --profiling.save_traces_folder profile_traces
windows cp4
traces cp4 20 30
FULL="--training.steps 10 --training.seq_len 8192 --compile.enable --compile.loss --parallelism.tensor_parallel_degree 2 --activation_checkpoint.mode full --metrics.log_freq 5"
T=130 fits 90 ours fsdp2tp2_full_ac 0,1,2,3 $FULL
grep -E "step +(1|5|10)/|Error|error" $out/logs/ours_fsdp2tp2_full_ac.log | sed 's/^\[rank0\]://' | cut -c1-150 | head
pack
