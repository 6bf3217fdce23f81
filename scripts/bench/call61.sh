#!/usr/bin/env bash
# Call 61 (1 GPU): (1) one compiled 1B block with wq/wk/wv and w1/w3 each fused into one linear
# (block_step.py --fuse) against the model's separate linears, Float8 and bf16, alternating;
# (2) the 1B Float8 row (AC off, batch 4) with --compile.tune_kernels beside the reference, one
# after the other on the same GPU; ours untuned last if time is left.
source scripts/bench/lib.sh
card
SHOW=6
blk() { block_step $1 0 ours --top 30 "${@:2}"; }  # blk NAME ARGS...: our block on GPU 0
fits 70 blk f8 --float8
fits 70 blk f8_fused --float8 --fuse
fits 70 blk bf
fits 70 blk bf_fused --fuse
fits 70 blk f8_fused_b --float8 --fuse
fits 70 blk f8_b --float8
export CONFIG_FILE=train_configs/llama3_1b.toml
F8_1B="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=150 fits 150 ref f8 0 $F8_1B --model.flavor 1B $REF_F8
T=200 fits 200 ours f8_tuned 0 $F8_1B --compile.loss --float8.enable --compile.tune_kernels
T=150 fits 150 ours f8 0 $F8_1B --compile.loss --float8.enable
for r in f8 f8_tuned; do windows $r; done
pack
