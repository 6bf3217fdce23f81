#!/usr/bin/env bash
# Call 117 (4 GPUs): prepared on 2026-11-29 (only one-GPU machines were lent then), not run yet.
# What the Triton gradient copy-in (--parallelism.fsdp_grad_copy_in triton, the default since
# f53c44c; docs/performance.md, finding 35) buys on #14's 8B FSDP4 bf16 selective-AC row: ours
# with it, ours with FSDP's own copy-in, ours with it again, the reference, one after the other.
source scripts/bench/lib.sh
card
S="$ROW_8K --compile.loss $SAC"
T=135 fits 135 ours fsdp4_sac_triton 0,1,2,3 $S
T=135 fits 135 ours fsdp4_sac_torch 0,1,2,3 $S --parallelism.fsdp_grad_copy_in torch
T=135 fits 135 ours fsdp4_sac_triton2 0,1,2,3 $S
T=135 fits 135 ref fsdp4_sac 0,1,2,3 $ROW_8K
grep -h "gradient copy-in" $out/logs/ours_fsdp4_sac_*.log | sort | uniq -c
pack
