#!/usr/bin/env bash
# Call 55 (2 GPUs): one compiled 1B block, forward + backward at batch 4 x 8,192, as the one-GPU
# trainer runs it (scripts/bench/block_step.py): ours with three RoPE formulations and two
# inductor settings against the reference's block, Float8 tensorwise and bf16, each GPU running
# its list one after the other (compare within a GPU; the first variant of each list repeats on
# the other to show the GPUs' difference). The script's defaults changed with finding 23 (swap,
# bfloat16 residual); the flags below spell out what ran: the model's form then and fp32 input.
source scripts/bench/lib.sh
card
T=200 SHOW=14
blk() { block_step "$@" --residual float32; }  # blk NAME GPU IMPL ARGS...
(
  fits 120 blk f8_pairs_0 0 ours --float8 --rope pairs
  fits 120 blk f8_swap_0 0 ours --float8 --rope swap
  fits 120 blk f8_complex_0 0 ours --float8 --rope complex
  fits 120 blk f8_ref_0 0 ref --float8
  SHOW=4 fits 100 blk bf16_pairs_0 0 ours --rope pairs
  SHOW=4 fits 100 blk bf16_swap_0 0 ours --rope swap
) > $out/gpu0.txt 2>&1 &
p0=$!
(
  fits 120 blk f8_ref_1 1 ref --float8
  fits 120 blk f8_pairs_1 1 ours --float8 --rope pairs
  TORCHINDUCTOR_MIX_ORDER_REDUCTION=0 fits 120 blk f8_pairs_nomix_1 1 ours --float8 --rope pairs
  TORCHINDUCTOR_LOOP_ORDERING_AFTER_FUSION=0 fits 120 blk f8_pairs_noloop_1 1 ours --float8 --rope pairs
  SHOW=4 fits 100 blk bf16_ref_1 1 ref
  TORCHINDUCTOR_MIX_ORDER_REDUCTION=0 fits 120 blk f8_swap_nomix_1 1 ours --float8 --rope swap
) > $out/gpu1.txt 2>&1 &
p1=$!
wait $p0 $p1
cat $out/gpu0.txt $out/gpu1.txt
pack
