#!/usr/bin/env bash
# Call 98 (one H200): what selective AC (every other matmul kept) costs one compiled 8B block with
# FSDP's bf16 parameters, in bf16 and in tensorwise Float8 (our backward and torchao's): the
# planner's tensorwise points under selective AC run 5-9 % faster than it estimates, so is the
# recompute itself cheaper than modelled, or is it the trainer around the block?
# Then scripts/bench/adam_kernel_time.py once, refactored onto cuda_timing.median_ms since call 95.
source scripts/bench/lib.sh
card
SHOW=10
B8="--flavor 8B --batch 1 --iters 30 --top 12 --params bfloat16"
T=90 fits 90 block_step bf_none 0 ours $B8 --ac none
T=90 fits 90 block_step bf_sac 0 ours $B8 --ac selective
T=90 fits 90 block_step f8_none 0 ours $B8 --float8 --ac none
T=90 fits 90 block_step f8_sac 0 ours $B8 --float8 --ac selective
T=90 fits 90 block_step f8ao_none 0 ours $B8 --float8 --torchao-backward --ac none
T=90 fits 90 block_step f8ao_sac 0 ours $B8 --float8 --torchao-backward --ac selective
(cd scripts/bench && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$site:$root timeout 100 python3 adam_kernel_time.py --flavor 1B 2>&1 | grep -v -i warn | tail -8)
pack
