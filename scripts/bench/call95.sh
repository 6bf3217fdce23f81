#!/usr/bin/env bash
# Call 95 (one H200): the Adam step's GPU time, kernels alone and with the host's launches, on
# 1B shapes: torch's fused kernel, CompiledAdamW, and the trial with the per-parameter scalars
# computed first (scripts/bench/adam_kernel_time.py).
source scripts/bench/lib.sh
card
cd scripts/bench && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$site:$root timeout 200 python3 adam_kernel_time.py --flavor 1B 2>&1 | grep -v -i warn | tail -8
