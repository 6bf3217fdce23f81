#!/usr/bin/env bash
# Call 121 (2x H200, the last 489 s of the session's device time): the Triton gradient copy-in in
# the trainer for the first time, on 8B FSDP2 bf16 under selective AC (call 82's 2-GPU form of
# #14's FSDP4 row): ours with it (the default), then with FSDP's own copy-in, one after the other.
# Result: with the kernel 9,031 (steps 11-20) and 9,035 (21-30) tokens/s/GPU, FSDP's own 8,972 and
# 8,964: +0.7 % and +0.8 %, both 79.25 GiB. Step 1 identical (loss 12.2244); step 10 9.6961 vs 9.6962.
source scripts/bench/lib.sh
card
S="$ROW_8K --compile.loss $SAC"
T=150 fits 150 ours fsdp2_sac_triton 0,1 $S
T=150 fits 150 ours fsdp2_sac_torch 0,1 $S --parallelism.fsdp_grad_copy_in torch
for f in $out/logs/ours_fsdp2_sac_*.log; do
  echo "== $(basename $f)"; grep -h "gradient copy-in" $f | sed 's/^\[rank0\]://' | head -2
  grep -E "INFO step +(10|20|30)/" $f | sed 's/^\[rank0\]://'
done
pack
