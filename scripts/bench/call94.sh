#!/usr/bin/env bash
# Call 94 (one H200): the 1B Float8 row (AC off, batch 4, tensorwise) untuned and with
# --compile.tune_kernels in one call, in the order ref, ours untuned, ours tuned.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=115 fits 115 ref f8 0 $ACO --model.flavor 1B $REF_F8
T=115 fits 115 ours f8 0 $ACO --compile.loss --float8.enable
T=230 fits 230 ours f8_tuned 0 $ACO --compile.loss --float8.enable --compile.tune_kernels
windows f8
for r in f8 f8_tuned; do echo $r; grep -E "INFO step +(1|10|20|30)/" $out/logs/ours_$r.log | sed 's/^\[rank0\]://' | cut -c1-150; done
pack
