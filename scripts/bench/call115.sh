#!/usr/bin/env bash
# Call 115 (one H200): FSDP2's gradient copy-in by our Triton kernel. The GPU tests (bits of an
# 8B block's buffer at world 1-8 against FSDP's; three FSDP2 steps on a one-rank NCCL group
# identical either way); then scripts/bench/fsdp_copy_in_step.py: 4 8B blocks under FSDP2 on one
# rank, seq 8192, torch's copy-in and ours in turns (A B B A ...), eager and compiled.
# Result: 5 passed (losses 8.7843, 8.8918, 8.8518 both ways); eager 98.49 -> 97.58 ms, compiled
# 92.82 -> 91.89 ms (medians of 10).
source scripts/bench/lib.sh
card
T=150 fits 150 gpu_test copy_in 0 tests/gpu/test_grad_copy_in_on_gpu.py
grep -E "losses|passed|failed|Error" $out/logs/copy_in.log | cut -c1-300
for extra in "" "--compile"; do
  (cd scripts/bench && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$site:$root timeout 200 python3 fsdp_copy_in_step.py \
    --flavor 8B --blocks 4 --seq 8192 --rounds 10 $extra 2>&1 | grep -E "H200|copy-in|Error" | cut -c1-200)
done
pack
