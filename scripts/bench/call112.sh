#!/usr/bin/env bash
# Call 112 (one H200): batched generation after its step was reworked (one index_copy_ per
# K/V into slots computed once per step, the mask once per step; eager decoding of sequences
# at one position through the model's forward again). Batch 1, 8B: the code before batching
# (424ea0f, unpacked in .bench/old: carry .bench) and the new code alternately; then ours at
# batch 16 and 64, eager at batch 1, and 1B at batch 1 and 16 beside transformers at 16.
# Result: 5 passed; 8B b1 old 7.22-7.42, new 7.20-7.40; eager b1 23.3-24.2; b16 8.02-8.19
# (1,953-1,996 tokens/s); b64 10.01-10.02 (6,387-6,397); 1B b1 2.31 (transformers 10.86-10.95),
# b16 2.64 (6,053-6,065 tokens/s; transformers 764-767).
source scripts/bench/lib.sh
old_speed() {  # as speed(), with the code of 424ea0f
  local name=$1; shift
  (cd $root/.bench/old && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$site:$root/.bench/old timeout ${T:-200} \
    python3 scripts/bench/generate_speed.py "$@" > $out/logs/speed_$name.log 2>&1)
  echo "== $name rc=$?"
  grep -E "H200|first token|Error" $out/logs/speed_$name.log | cut -c1-200
}
card
T=200 fits 200 gpu_test generate 0 tests/gpu/test_generate_on_gpu.py
grep -E "relative|graph vs|passed|failed|Error|tokens in|sequences in" $out/logs/generate.log | cut -c1-200
T=80 fits 80 old_speed 8b_old_a --flavor 8B --impl ours --repeats 3
T=80 fits 80 speed 8b_new_a --flavor 8B --batch 1 --impl ours --repeats 3
T=80 fits 80 old_speed 8b_old_b --flavor 8B --impl ours --repeats 3
T=80 fits 80 speed 8b_new_b --flavor 8B --batch 1 --impl ours --repeats 3
T=80 fits 80 speed 8b_b1_eager --flavor 8B --batch 1 --impl ours --eager --repeats 2
T=90 fits 90 speed 8b_b16 --flavor 8B --batch 16 --impl ours --repeats 2
T=120 fits 120 speed 8b_b64 --flavor 8B --batch 64 --impl ours --repeats 2
T=90 fits 90 speed 1b_b1 --flavor 1B --batch 1 --impl both --repeats 2
T=120 fits 120 speed 1b_b16 --flavor 1B --batch 16 --impl both --repeats 2
pack
