#!/usr/bin/env bash
# Call 65 (1 GPU): the 8B Float8 block's norm backward writes the float8 cast of the recomputed
# norm output transposed from inside a row reduction (1.77 ms of an 18 ms block in call 64).
# Inductor tiling switches that could keep that transposed write out of the reduction, timed on
# one compiled 8B block (scripts/bench/block_step.py), one after the other on GPU 0.
source scripts/bench/lib.sh
card
T=120 SHOW=18
# blk NAME ARGS...: our 8B block on GPU 0
blk() { block_step $1 0 ours --flavor 8B --batch 1 --iters 30 --top 12 "${@:2}"; }
fits 45 blk f8 --float8
fits 45 blk f8_nd --float8 --inductor triton.prefer_nd_tiling=1
fits 45 blk f8_nocoalesce --float8 --inductor triton.coalesce_tiling_analysis=0
fits 45 blk f8_nd_b --float8 --inductor triton.prefer_nd_tiling=1
fits 45 blk f8_b --float8
fits 45 blk bf_nd --inductor triton.prefer_nd_tiling=1
pack
