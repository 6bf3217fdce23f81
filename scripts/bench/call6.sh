#!/usr/bin/env bash
# Call 6 (2 GPUs): the 1B rows side by side after the compiled optimizer, the logits release and
# Float8 on every linear (one GPU per framework, concurrently), then 1B FSDP2 Float8 (float8
# all-gather + precomputed scales) with profiler traces.
source scripts/bench/lib.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
export CONFIG_FILE=train_configs/llama3_1b.toml
S="--training.steps 30 --training.seq_len 8192 --compile.enable"
SAC="--activation_checkpoint.mode selective --activation_checkpoint.save_matmuls alternate"
B4="--training.local_batch_size 4 --activation_checkpoint.mode none"
F8R="--model.converters quantize.linear.float8"
T=170 ref 1b_sac 0 $S --model.flavor 1B --training.local_batch_size 2 &
T=170 ours 1b_sac 1 $S --compile.loss --training.local_batch_size 2 $SAC &
wait
T=170 ref 1b_acoff 0 $S --model.flavor 1B $B4 &
T=170 ours 1b_acoff 1 $S --compile.loss $B4 &
wait
T=170 ref 1b_f8 0 $S --model.flavor 1B $B4 $F8R &
T=170 ours 1b_f8 1 $S --compile.loss $B4 --float8.enable --float8.skip_small false &
wait
T=170 fits 200 ours 1b_f8_skipsmall 0 $S --compile.loss $B4 --float8.enable &
T=170 fits 200 ours 1b_acoff_fused 1 $S --compile.loss $B4 --optimizer.implementation fused &
wait
P="--profiling.enable_profiling --profiling.profile_freq 30 --profiling.profiler_warmup 2 --profiling.profiler_active 1"
F8RF="$F8R --quantize.linear.float8.enable_fsdp_float8_all_gather --quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp"
F8O="--float8.enable --float8.fsdp_float8_all_gather --float8.precompute_scales --float8.skip_small false"
T=140 fits 140 ref 1b_fsdp2_f8 0,1 $S --model.flavor 1B --training.local_batch_size 2 $F8RF $P --profiling.save_traces_folder profile_traces
T=140 fits 140 ours 1b_fsdp2_f8 0,1 $S --compile.loss --training.local_batch_size 2 $SAC $F8O $P
for s in ref ours; do
  grep -E "step:? +(10|20|30)[ /]" $out/logs/${s}_1b_fsdp2_f8.log | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
  f=$(ls /tmp/${s}_1b_fsdp2_f8/profile_traces/iteration_30/rank0_trace.json 2>/dev/null) && \
    python3 scripts/trace_summary.py $f --top 12 > $out/logs/trace_fsdp2_f8_$s.txt 2>&1 && cut -c1-150 $out/logs/trace_fsdp2_f8_$s.txt
done
grep -E "Error|error" $out/logs/ours_*.log | grep -v "^.*warn" | head -5
pack
