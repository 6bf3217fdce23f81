#!/usr/bin/env bash
# Call 92 (one H200): the 1B Float8 row (AC off, batch 4, tensorwise) with ours compiled with
# --compile.tune_kernels (inductor's coordinate-descent tuning), in the order ours, ref, ours.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=230 fits 230 ours f8_tuned_a 0 $ACO --compile.loss --float8.enable --compile.tune_kernels
T=115 fits 115 ref f8 0 $ACO --model.flavor 1B $REF_F8
T=200 fits 200 ours f8_tuned_b 0 $ACO --compile.loss --float8.enable --compile.tune_kernels
windows f8
for r in f8_tuned_a f8_tuned_b; do echo $r; grep -E "INFO step +(1|10|20|30)/" $out/logs/ours_$r.log | sed 's/^\[rank0\]://' | cut -c1-150; done
pack
