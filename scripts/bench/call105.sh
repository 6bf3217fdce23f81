#!/usr/bin/env bash
# Call 105 (one H200): generation on a GPU, never run there before. (1) tests/gpu/test_generate_on_gpu.py:
# the bf16 KV-cache path against a full forward, and the command line on cuda. (2)
# scripts/bench/generate_speed.py: our decode loop beside transformers' generate, 1B and 8B
# shapes, random weights; the prompt's pass with the head on the last position only against the
# head on every position (8B, an 8,192-token prompt).
# Ran twice: in the first run speed() (then defined here, now in lib.sh) passed its NAME on to the
# script, which refused it (fixed).
source scripts/bench/lib.sh
card
T=150 fits 150 gpu_test generate 0 tests/gpu/test_generate_on_gpu.py
grep -E "relative|passed|failed|Error|tokens in" $out/logs/generate.log | cut -c1-200
T=150 fits 150 speed 1b --flavor 1B --prompt-tokens 512 --new-tokens 256
T=200 fits 200 speed 8b --flavor 8B --prompt-tokens 512 --new-tokens 256
T=150 fits 150 speed 8b_long --flavor 8B --prompt-tokens 8192 --new-tokens 64 --impl ours
T=150 fits 150 speed 8b_long_all --flavor 8B --prompt-tokens 8192 --new-tokens 64 --impl ours --all-positions
pack
