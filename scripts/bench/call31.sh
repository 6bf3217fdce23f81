#!/usr/bin/env bash
# Call 31 (same warm 4x H200 machine as call 30, right after it): ours 8B CP4 at seq 32768 (call
# 30 skipped it when the 1B Float8 run overran its limit; the reference's CP4 ran in call 30),
# then 8B FSDP4 bf16 selective AC side by side.
# Ours ran with --compile.tune_kernels as the default of that commit; it is passed explicitly here.
source scripts/bench/lib.sh
card
CP=$CP4_ROW
T=200 fits 200 ours cp4 0,1,2,3 $CP --compile.loss --compile.tune_kernels $SAC
grep -E "step +(10|20)/" $out/logs/ours_cp4.log | sed 's/^\[rank0\]://' | cut -c1-150
S=$ROW_8K
T=160 fits 300 ours fsdp4 0,1,2,3 $S --compile.loss --compile.tune_kernels $SAC
T=140 fits 140 ref fsdp4 0,1,2,3 $S
windows fsdp4
pack
