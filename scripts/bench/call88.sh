#!/usr/bin/env bash
# Call 88 (one H200): the compiled AdamW step on 1B and 8B-shard shapes (call 87's 1B Float8 trace
# showed its kernel at about 1.9 TB/s): each implementation with the gradient norm, then the
# compiled step alone with its kernel compiled with dynamic or static sizes, with and without
# inductor's coordinate-descent tuning.
source scripts/bench/lib.sh
card
for f in "--flavor 1B" "--flavor 8B --shard 4"; do
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$site:$root timeout 200 python3 scripts/bench/optimizer_step.py $f --compiled-kernels 2>&1 | grep -v -i warn | tail -12
done
