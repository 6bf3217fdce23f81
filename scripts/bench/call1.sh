#!/usr/bin/env bash
# Call 1: 1B diagnostics on 4 separate GPUs (traces with SAC, memory snapshots with AC off), then 8B CP4 at 32k.
source scripts/bench/lib.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
P="--profiling.enable_profiling --profiling.profile_freq 35 --profiling.profiler_warmup 3 --profiling.profiler_active 1"
M="--profiling.enable_memory_snapshot --profiling.profile_freq 35"
S="--training.steps 35 --training.seq_len 8192"
export CONFIG_FILE=train_configs/llama3_1b.toml
ref  1b_sac 0 $S --model.flavor 1B --compile.enable --training.local_batch_size 2 $P --profiling.save_traces_folder profile_traces &
ours 1b_sac 1 $S --compile.enable --compile.loss --training.local_batch_size 2 --activation_checkpoint.mode selective --activation_checkpoint.save_matmuls alternate $P &
ref  1b_acoff 2 $S --model.flavor 1B --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none $M &
ours 1b_acoff 3 $S --compile.enable --compile.loss --training.local_batch_size 4 --activation_checkpoint.mode none $M &
wait
for s in ref ours; do
  python3 scripts/trace_summary.py $(ls /tmp/${s}_1b_sac/profile_traces/iteration_35/rank0_trace.json) --top 12 > $out/logs/trace_$s.txt 2>&1
  python3 scripts/memory_summary.py $(ls /tmp/${s}_1b_acoff/memory_snapshot/iteration_35/rank0_memory_snapshot.pickle) --top 30 > $out/logs/mem_$s.txt 2>&1
done
cat $out/logs/trace_*.txt $out/logs/mem_*.txt | cut -c1-160
unset CONFIG_FILE
CP=$CP4_ROW
T=330 ref cp4 0,1,2,3 $CP
T=330 ours cp4 0,1,2,3 $CP --compile.loss --activation_checkpoint.mode selective --activation_checkpoint.save_matmuls alternate
pack
