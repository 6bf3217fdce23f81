#!/usr/bin/env bash
# Call 125 (4 GPUs): prepared on 2026-12-01 (only one-GPU machines were lent then), not run yet.
# What the fused float8 SwiGLU backward (--float8.fused_swiglu, the default since call 124;
# docs/performance.md, finding 36) buys on #13's 8B FSDP4 Float8 tensorwise selective-AC row:
# the reference, ours, ours with --float8.fused_swiglu false, ours, one after the other.
source scripts/bench/lib.sh
card
S="$ROW_8K --compile.loss $SAC $OURS_F8_FSDP"
T=135 fits 135 ref fsdp4_f8 0,1,2,3 $ROW_8K $REF_F8_FSDP
T=135 fits 135 ours fsdp4_f8 0,1,2,3 $S
T=135 fits 135 ours fsdp4_f8_unfused 0,1,2,3 $S --float8.fused_swiglu false
T=135 fits 135 ours fsdp4_f8_again 0,1,2,3 $S
windows fsdp4_f8
for r in fsdp4_f8_unfused fsdp4_f8_again; do
  echo "ours $r"; grep -E "INFO step +(10|20|30)/" $out/logs/ours_$r.log | sed 's/^\[rank0\]://' | cut -c1-160
done
pack
