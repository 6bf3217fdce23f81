#!/usr/bin/env bash
# Call 64 (1 or 2 GPUs): one compiled 8B block (batch 1 x 8,192, the 8B rows' shapes, bf16
# residual as under FSDP), ours and the reference's, Float8 and bf16, one after the other on
# GPU 0 in the order A B B A, by kernel category (scripts/bench/block_step.py).
source scripts/bench/lib.sh
card
SHOW=6
# blk NAME IMPL ARGS...: one 8B block on GPU 0
blk() { block_step $1 0 $2 --flavor 8B --batch 1 --iters 30 --top 30 "${@:3}"; }
fits 60 blk f8 ours --float8
fits 60 blk ref_f8 ref --float8
fits 60 blk ref_f8_b ref --float8
fits 60 blk f8_b ours --float8
fits 60 blk bf ours
fits 60 blk ref_bf ref
fits 60 blk ref_bf_b ref
fits 60 blk bf_b ours
pack
