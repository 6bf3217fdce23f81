#!/usr/bin/env bash
# Call 5 (2 GPUs): where the 1B memory gaps are (snapshots: bf16 AC off both sides, our Float8 with
# every linear converted), then 1B FSDP2 Float8 (float8 all-gather + precomputed scales) side by side
# with profiler traces of step 30.
source scripts/bench/lib.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
export CONFIG_FILE=train_configs/llama3_1b.toml
M="--training.steps 12 --training.seq_len 8192 --profiling.enable_memory_snapshot --profiling.profile_freq 12"
B4="--compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
O="--compile.loss --optimizer.implementation compiled"
T=150 ref 1b_mem 0 $M $B4 --model.flavor 1B &
T=150 ours 1b_mem 1 $M $B4 $O &
wait
T=150 ours 1b_f8all_mem 1 $M $B4 $O --float8.enable --float8.skip_small false &
T=150 ours 1b_f8_speed 0 --training.steps 30 --training.seq_len 8192 $B4 $O --float8.enable &
wait
for s in ref_1b_mem ours_1b_mem ours_1b_f8all_mem; do
  f=$(ls /tmp/${s}/memory_snapshot/iteration_12/rank0_memory_snapshot.pickle 2>/dev/null) && \
    python3 scripts/memory_summary.py $f --top 16 --last 14 > $out/logs/mem_$s.txt 2>&1 && cut -c1-150 $out/logs/mem_$s.txt
done
P="--profiling.enable_profiling --profiling.profile_freq 30 --profiling.profiler_warmup 2 --profiling.profiler_active 1"
S="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 2"
F8R="--model.converters quantize.linear.float8 --quantize.linear.float8.enable_fsdp_float8_all_gather --quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp"
F8O="--float8.enable --float8.fsdp_float8_all_gather --float8.precompute_scales --float8.skip_small false"
SAC="--activation_checkpoint.mode selective --activation_checkpoint.save_matmuls alternate"
T=150 fits 150 ref 1b_fsdp2_f8 0,1 $S --model.flavor 1B $F8R $P --profiling.save_traces_folder profile_traces
T=150 fits 150 ours 1b_fsdp2_f8 0,1 $S $SAC $O $F8O $P
for s in ref ours; do
  grep -E "step:? +(10|20|30)[ /]" $out/logs/${s}_1b_fsdp2_f8.log | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
  f=$(ls /tmp/${s}_1b_fsdp2_f8/profile_traces/iteration_30/rank0_trace.json 2>/dev/null) && \
    python3 scripts/trace_summary.py $f --top 14 > $out/logs/trace_fsdp2_f8_$s.txt 2>&1 && cut -c1-150 $out/logs/trace_fsdp2_f8_$s.txt
done
pack
