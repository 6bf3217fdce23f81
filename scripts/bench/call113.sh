#!/usr/bin/env bash
# Call 113 (one H200): FSDP2's reduce-scatter copy-in for one block, alone
# (scripts/bench/reduce_scatter_copy_in.py, its first version, without the Triton variants):
# chunk_cat against one strided copy per gradient, 8B at world 4 and 2, 1B at world 4.
# Result: 8B world 4: chunk_cat 0.645 ms (2.03 TB/s), strided copies 0.738 (1.77); world 2: 0.660
# (1.98) and 0.738; 1B world 4: 0.192 (1.90) and 0.230 (1.58). Same buffer both ways.
source scripts/bench/lib.sh
card
for args in "--flavor 8B --world 4" "--flavor 8B --world 2" "--flavor 1B --world 4"; do
  (cd scripts/bench && PYTHONPATH=$site:$root timeout 120 python3 reduce_scatter_copy_in.py $args 2>&1 | grep -v -i warn)
done
