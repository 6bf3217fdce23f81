#!/usr/bin/env bash
# Call 73 (4 GPUs, right after call 72 on the same machine): the AC-off rows. The reference's
# 8B FSDP4 Float8 AC off against call 72's ours (12,858 tokens/s, 65.84 GiB) and ours with
# torchao's backward (--float8.own_backward false: no float8 norm outputs kept without AC);
# then 8B FSDP4 bf16 AC off, ours with the copy-engine all-gather against the reference.
source scripts/bench/lib.sh
card
S=$ROW_8K
T=135 fits 135 ref fsdp4_f8_acoff 0,1,2,3 $S $REF_F8_FSDP --activation_checkpoint.mode none
T=135 fits 135 ours fsdp4_f8_acoff_aobw 0,1,2,3 $S --compile.loss $OURS_F8_FSDP --activation_checkpoint.mode none --float8.own_backward false
grep -E "INFO step +(10|20|30)/|rror" $out/logs/ours_fsdp4_f8_acoff_aobw.log | cut -c1-150 | tail -4
T=135 fits 135 ours fsdp4_acoff_ce 0,1,2,3 $S --compile.loss --activation_checkpoint.mode none --parallelism.fsdp_all_gather copy_engines
T=135 fits 135 ref fsdp4_acoff 0,1,2,3 $S --activation_checkpoint.mode none
grep -E "step: +(10|20|30) " $out/logs/ref_fsdp4_f8_acoff.log | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
grep -E "step: +(10|20|30) " $out/logs/ref_fsdp4_acoff.log | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
grep -E "INFO step +(10|20|30)/|rror" $out/logs/ours_fsdp4_acoff_ce.log | cut -c1-150 | tail -4
pack
