#!/usr/bin/env bash
# Call 97 (one H200): #14's 1B AC-off bf16 row (batch 4), reference and ours on the same GPU in
# the order A B B A. The second pair traces step 30 (torch profiler), so its steps 11-20 give the
# other order's ratio and its traces the kernel-by-kernel comparison (gzipped into $OUT).
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=120 fits 120 ref aco 0 $ACO --model.flavor 1B
T=110 fits 110 ours aco 0 $ACO --compile.loss
T=110 fits 110 ours acop 0 $ACO --compile.loss $PROFILE_30
T=110 fits 110 ref acop 0 $ACO --model.flavor 1B $REF_PROFILE_30
windows aco
windows acop
traces acop 30 60
for s in ref ours; do
  f=/tmp/${s}_acop/profile_traces/iteration_30/rank0_trace.json
  [ -f $f ] && gzip -c $f > $out/trace_${s}_acop.json.gz && ls -la $out/trace_${s}_acop.json.gz
done
pack
