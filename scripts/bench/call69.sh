#!/usr/bin/env bash
# Call 69 (1 GPU): the 1B Float8 row (AC off, batch 4 x 8,192, 30 steps) with our tensorwise
# backward (the default) beside the reference, one after the other on GPU 0, then ours with
# torchao's backward (--float8.own_backward false) if time is left.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
F8_1B="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=150 fits 150 ours f8 0 $F8_1B --compile.loss --float8.enable
T=150 fits 150 ref f8 0 $F8_1B --model.flavor 1B $REF_F8
T=150 fits 150 ours f8_torchao 0 $F8_1B --compile.loss --float8.enable --float8.own_backward false
for r in f8 f8_torchao; do windows $r; done
pack
