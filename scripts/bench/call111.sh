#!/usr/bin/env bash
# Call 111 (one H200): batched generation. The GPU tests (the graph over three sequences at
# different positions; the CLI's prompts file in batches); scripts/bench/generate_speed.py on 8B,
# 512-token prompts, 256 new tokens, greedy: ours graphed at batch 1, 4, 16 and 64, ours eager
# at batch 1 (eager decoding now runs the graph's step, decode_step, from Python), and
# transformers' generate at batch 16.
# Result: 5 passed (three sequences: 2.11 %, 90/93 argmax); 8B ms/step: b1 7.68-7.82, b4 7.85-7.95,
# b16 8.49-8.51 (1,881-1,885 tokens/s), b64 10.37-10.55; eager b1 30-32 (decode_step from Python);
# transformers b16 26.71-30.61 (523-599 tokens/s).
source scripts/bench/lib.sh
card
T=200 fits 200 gpu_test generate 0 tests/gpu/test_generate_on_gpu.py
grep -E "relative|graph vs|passed|failed|Error|tokens in|sequences in" $out/logs/generate.log | cut -c1-200
T=90 fits 90 speed 8b_b1 --flavor 8B --batch 1 --impl ours --repeats 2
T=90 fits 90 speed 8b_b1_eager --flavor 8B --batch 1 --impl ours --eager --repeats 2
T=90 fits 90 speed 8b_b4 --flavor 8B --batch 4 --impl ours --repeats 2
T=90 fits 90 speed 8b_b16 --flavor 8B --batch 16 --impl ours --repeats 2
T=120 fits 120 speed 8b_b64 --flavor 8B --batch 64 --impl ours --repeats 2
T=150 fits 150 speed 8b_b16_hf --flavor 8B --batch 16 --impl hf --repeats 2
pack
