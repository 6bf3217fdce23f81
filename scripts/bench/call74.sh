#!/usr/bin/env bash
# Call 74 (4 GPUs, right after call 73 on the same machine): call 72's Float8 selective-AC pair
# again in the other order (the reference first), then 8B PP2 x FSDP2 (Interleaved1F1B, 8
# microbatches) bf16, ours with the copy-engine all-gather against the reference.
source scripts/bench/lib.sh
card
S=$ROW_8K
T=135 fits 135 ref fsdp4_f8 0,1,2,3 $S $REF_F8_FSDP
T=135 fits 135 ours fsdp4_f8 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP
windows fsdp4_f8
T=150 fits 150 ours pp2_ce 0,1,2,3 $PP2_ROW --compile.loss $SAC --parallelism.fsdp_all_gather copy_engines
T=150 fits 150 ref pp2 0,1,2,3 $PP2_ROW
grep -E "step: +(10|20) " $out/logs/ref_pp2.log | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
grep -E "INFO step +(10|20)/|rror" $out/logs/ours_pp2_ce.log | cut -c1-150 | tail -4
pack
