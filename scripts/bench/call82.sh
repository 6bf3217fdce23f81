#!/usr/bin/env bash
# Call 82 (2x H200): whether the copy-engine all-gather should be the default for FSDP-only
# layouts. 8B FSDP2 under selective AC, one after the other on both GPUs: bf16 with NCCL's
# all-gather, with the copy engines, the reference; then Float8 tensorwise (float8 all-gather,
# precomputed scales) with the copy engines and with NCCL's.
source scripts/bench/lib.sh
card
S=$ROW_8K
T=150 fits 150 ours fsdp2_nccl 0,1 $S --compile.loss $SAC
T=150 fits 150 ours fsdp2_ce 0,1 $S --compile.loss $SAC --parallelism.fsdp_all_gather copy_engines
T=150 fits 150 ref fsdp2 0,1 $S
T=140 fits 140 ours fsdp2_f8_ce 0,1 $S --compile.loss $SAC $OURS_F8_FSDP --parallelism.fsdp_all_gather copy_engines
T=140 fits 140 ours fsdp2_f8_nccl 0,1 $S --compile.loss $SAC $OURS_F8_FSDP
for r in ours_fsdp2_nccl ours_fsdp2_ce ref_fsdp2 ours_fsdp2_f8_ce ours_fsdp2_f8_nccl; do
  echo "$r"; grep -E "step:? +(10|20|30)[ /]" $out/logs/$r.log | grep -v validation | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
done
pack
