#!/usr/bin/env bash
# Call 114 (one H200): call 113 again with one Triton kernel per gradient beside chunk_cat and
# the strided copies (block sizes 1,024, 4,096 and 16,384), 8B at world 4 and 2, 1B at world 4;
# and a plain bf16 -> float32 copy of the block's gradients into a contiguous buffer, for the
# bandwidth this card gives such a cast.
# Result: 8B world 4: chunk_cat 0.645 ms (2.03 TB/s), strided 0.738, contiguous cast 0.638 (2.05),
# triton 1,024/4,096/16,384 0.345 (3.79 TB/s)/0.358/0.354; world 2: 0.661, 0.739, 0.639, 0.340/0.357/0.354;
# 1B world 4: 0.192, 0.229, 0.202, 0.114/0.114/0.119. (The buffer check printed the old text:
# chunk_cat against the strided copies only; the Triton bits are checked by call 115's GPU test.)
source scripts/bench/lib.sh
card
for args in "--flavor 8B --world 4" "--flavor 8B --world 2" "--flavor 1B --world 4"; do
  (cd scripts/bench && PYTHONPATH=$site:$root timeout 120 python3 reduce_scatter_copy_in.py $args 2>&1 | grep -v -i warn)
done
