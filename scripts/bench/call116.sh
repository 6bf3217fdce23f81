#!/usr/bin/env bash
# Call 116 (one H200): FSDP2's all-gather copy-out of one block alone
# (scripts/bench/all_gather_copy_out.py): torch.split_with_sizes_copy against a Triton copy per
# parameter, 8B at world 4 and 2, 1B at world 4.
# Result: split_with_sizes_copy already at 3.79 TB/s (8B world 4: 0.230 ms, Triton 0.230; world 2:
# 0.231 and 0.224; 1B: 0.080 and 0.077): nothing to gain, not pursued.
source scripts/bench/lib.sh
card
for args in "--flavor 8B --world 4" "--flavor 8B --world 2" "--flavor 1B --world 4"; do
  (cd scripts/bench && PYTHONPATH=$site:$root timeout 120 python3 all_gather_copy_out.py $args 2>&1 | grep -v -i warn)
done
