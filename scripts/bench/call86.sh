#!/usr/bin/env bash
# Call 86 (one H200): the 1B Float8 row (AC off, batch 4, tensorwise) with float8_recompute.py's
# pass, the reference and ours one after the other, in the order ref, ours, ours, ref.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=115 fits 115 ref f8_a 0 $ACO --model.flavor 1B $REF_F8
T=115 fits 115 ours f8_a 0 $ACO --compile.loss --float8.enable
T=115 fits 115 ours f8_b 0 $ACO --compile.loss --float8.enable
T=115 fits 115 ref f8_b 0 $ACO --model.flavor 1B $REF_F8
for r in f8_a f8_b; do windows $r; done
pack
