#!/usr/bin/env bash
# Call 119 (one H200): the gradient copy-in kernel with the blocks along the grid's first
# dimension (the second takes at most 65,535 programs; the output head's 525 M gradients need
# 128,256 per rank at world 4): the GPU tests with the head's shape added; the kernel's time
# again (scripts/bench/reduce_scatter_copy_in.py, 8B world 4) and the 4-block FSDP2 step.
# Result: 8 passed (the head at world 1, 2, 4 included); kernel 0.338 ms against chunk_cat's 0.643;
# 4 compiled blocks 94.58 -> 92.69 ms (medians of 10; min 90.71 and 90.39).
source scripts/bench/lib.sh
card
T=200 fits 200 gpu_test copy_in 0 tests/gpu/test_grad_copy_in_on_gpu.py
grep -E "losses|passed|failed|Error" $out/logs/copy_in.log | cut -c1-300
(cd scripts/bench && PYTHONPATH=$site:$root timeout 120 python3 reduce_scatter_copy_in.py --flavor 8B --world 4 2>&1 | grep -v -i warn)
(cd scripts/bench && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$site:$root timeout 200 python3 fsdp_copy_in_step.py \
  --flavor 8B --blocks 4 --seq 8192 --rounds 10 --compile 2>&1 | grep -E "H200|copy-in|Error" | cut -c1-200)
pack
