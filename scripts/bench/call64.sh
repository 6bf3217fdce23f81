#!/usr/bin/env bash
# Call 64 (1 or 2 GPUs): one compiled 8B block (batch 1 x 8,192, the 8B rows' shapes, bf16
# residual as under FSDP), ours and the reference's, Float8 and bf16, one after the other on
# GPU 0 in the order A B B A, by kernel category (scripts/bench/block_step.py).
source scripts/bench/lib.sh
card
blk() {  # blk NAME IMPL ARGS...: one block_step.py run on GPU 0
  local name=$1 impl=$2 path=$root; shift 2
  [ $impl = ref ] && path=$peer/torchtitan
  CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_CACHE_DIR=/tmp/ic_$name PYTHONPATH=$site:$path timeout 150 \
    python3 scripts/bench/block_step.py --impl $impl --flavor 8B --batch 1 --iters 30 --top 30 "$@" \
    > $out/logs/blk_$name.log 2>&1
  echo "== $name rc=$?"; grep -A6 "forward+backward" $out/logs/blk_$name.log | grep -v -i warn | cut -c1-160
}
fits 60 blk f8 ours --float8
fits 60 blk ref_f8 ref --float8
fits 60 blk ref_f8_b ref --float8
fits 60 blk f8_b ours --float8
fits 60 blk bf ours
fits 60 blk ref_bf ref
fits 60 blk ref_bf_b ref
fits 60 blk bf_b ours
pack
