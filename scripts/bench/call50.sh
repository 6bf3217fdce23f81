#!/usr/bin/env bash
# Call 50 (2 GPUs; only 1- and 2-GPU machines were lent this session): where the 1B rows' time
# and memory go now, on both sides, one GPU each, concurrently. Traces of step 12 (AC off batch 4,
# selective AC batch 2, Float8 tensorwise AC off batch 4), then memory snapshots of step 12 in
# separate runs (the allocator's stack recording slows the host). The AC-off traces come back
# gzipped for a closer look.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
B="--training.steps 12 --training.seq_len 8192 --compile.enable"
ACO="$B --training.local_batch_size 4 --activation_checkpoint.mode none"
SAC2="$B --training.local_batch_size 2"
P="--profiling.enable_profiling --profiling.profile_freq 12 --profiling.profiler_warmup 2 --profiling.profiler_active 1"
M="--profiling.enable_memory_snapshot --profiling.profile_freq 12"
pair() {  # pair NAME OURS_ARGS -- REF_ARGS
  local name=$1; shift; local o=() r=(); while [ "$1" != "--" ]; do o+=("$1"); shift; done; shift; r=("$@")
  T=150 fits 150 ours $name 0 "${o[@]}" &
  T=150 fits 150 ref $name 1 "${r[@]}" &
  wait
}
pair 1b_aco_tr $ACO --compile.loss $P -- $ACO --model.flavor 1B $P --profiling.save_traces_folder profile_traces
traces 1b_aco_tr 12 25
pair 1b_sac_tr $SAC2 --compile.loss $SAC $P -- $SAC2 --model.flavor 1B $P --profiling.save_traces_folder profile_traces
traces 1b_sac_tr 12 20
pair 1b_f8_tr $ACO --compile.loss --float8.enable $P -- $ACO --model.flavor 1B $REF_F8 $P --profiling.save_traces_folder profile_traces
traces 1b_f8_tr 12 25
pair 1b_sac_mem $SAC2 --compile.loss $SAC $M -- $SAC2 --model.flavor 1B $M
for run in ref_1b_sac_mem ours_1b_sac_mem; do memory $run 12 --top 25 --last 10; done
pair 1b_f8_mem $ACO --compile.loss --float8.enable $M -- $ACO --model.flavor 1B $REF_F8 $M
for run in ref_1b_f8_mem ours_1b_f8_mem; do memory $run 12 --top 25 --last 10; done
for s in ours ref; do
  f=/tmp/${s}_1b_aco_tr/profile_traces/iteration_12/rank0_trace.json
  [ -f $f ] && gzip -c $f > $out/${s}_1b_aco_trace.json.gz
  f=/tmp/${s}_1b_f8_tr/profile_traces/iteration_12/rank0_trace.json
  [ -f $f ] && gzip -c $f > $out/${s}_1b_f8_trace.json.gz
done
ls -la $out
pack
