#!/usr/bin/env bash
# Call 7 (2 GPUs): 1B FSDP2, Float8 (float8 all-gather + precomputed scales, every linear) and bf16,
# side by side, with profiler traces of step 30 (compare the steps 11-20 window: no profiler there).
source scripts/bench/lib.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
export CONFIG_FILE=train_configs/llama3_1b.toml
S="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 2"
SAC="--activation_checkpoint.mode selective --activation_checkpoint.save_matmuls alternate"
P="--profiling.enable_profiling --profiling.profile_freq 30 --profiling.profiler_warmup 2 --profiling.profiler_active 1"
F8R="--model.converters quantize.linear.float8 --quantize.linear.float8.enable_fsdp_float8_all_gather --quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp"
F8O="--float8.enable --float8.fsdp_float8_all_gather --float8.precompute_scales --float8.skip_small false"
T=140 fits 140 ref 1b_fsdp2_f8 0,1 $S --model.flavor 1B $F8R $P --profiling.save_traces_folder profile_traces
T=140 fits 140 ours 1b_fsdp2_f8 0,1 $S --compile.loss $SAC $F8O $P
T=140 fits 140 ref 1b_fsdp2_bf16 0,1 $S --model.flavor 1B
T=140 fits 140 ours 1b_fsdp2_bf16 0,1 $S --compile.loss $SAC
for r in 1b_fsdp2_f8 1b_fsdp2_bf16; do for s in ref ours; do
  echo "$s $r"; grep -E "step:? +(10|20|30)[ /]" $out/logs/${s}_$r.log | grep -v validation | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
done; done
for s in ref ours; do
  f=$(ls /tmp/${s}_1b_fsdp2_f8/profile_traces/iteration_30/rank0_trace.json 2>/dev/null) && \
    python3 scripts/trace_summary.py $f --top 14 > $out/logs/trace_fsdp2_f8_$s.txt 2>&1 && cut -c1-150 $out/logs/trace_fsdp2_f8_$s.txt
done
pack
