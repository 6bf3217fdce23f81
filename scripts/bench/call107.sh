#!/usr/bin/env bash
# Call 107 (one H200): decoding replayed as a CUDA graph (torchtitan/inference/graphed_decode.py).
# (1) tests/gpu/test_generate_on_gpu.py: the graph's logits against the eager cached forward, the
# command line with and without --eager. (2) scripts/bench/generate_speed.py, random weights:
# 8B and 1B, ours (graph) beside ours --eager and transformers' generate; 8B after an 8,192-token
# prompt, graph and eager.
source scripts/bench/lib.sh
card
T=150 fits 150 gpu_test generate 0 tests/gpu/test_generate_on_gpu.py
grep -E "relative|graph vs|passed|failed|Error|tokens in" $out/logs/generate.log | cut -c1-200
T=150 fits 150 speed 8b --flavor 8B --prompt-tokens 512 --new-tokens 256
T=100 fits 100 speed 8b_eager --flavor 8B --prompt-tokens 512 --new-tokens 256 --impl ours --eager
T=120 fits 120 speed 1b --flavor 1B --prompt-tokens 512 --new-tokens 256
T=100 fits 100 speed 8b_long --flavor 8B --prompt-tokens 8192 --new-tokens 64 --impl ours
T=100 fits 100 speed 8b_long_eager --flavor 8B --prompt-tokens 8192 --new-tokens 64 --impl ours --eager
pack
