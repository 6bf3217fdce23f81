#!/usr/bin/env bash
# Call 17 (4 GPUs): 8B side by side, one call. (1) FSDP2xTP2 Float8 (tensorwise, float8
# all-gather, precomputed scales, selective AC): the reference (plain TP styles in v0.2.2 with
# this converter name), ours with torchao's float8 TP styles, ours with plain ones. (2) FSDP4 bf16
# AC off. (3) CP4 at seq 32768, selective AC, 20 steps (steps 11-20).
source scripts/bench/lib.sh
card
S=$ROW_8K
TP2="--parallelism.tensor_parallel_degree 2"
CP=$CP4_ROW
T=150 fits 470 ref fsdp2tp2_f8 0,1,2,3 $S $TP2 $REF_F8_FSDP
T=150 fits 400 ours fsdp2tp2_f8 0,1,2,3 $S $TP2 --compile.loss $SAC $OURS_F8_FSDP
T=150 fits 330 ours fsdp2tp2_f8_plain_tp 0,1,2,3 $S $TP2 --compile.loss $SAC $OURS_F8_FSDP --float8.tp_float8_all_gather false
T=150 fits 270 ref fsdp4_acoff 0,1,2,3 $S --activation_checkpoint.mode none
T=150 fits 210 ours fsdp4_acoff 0,1,2,3 $S --compile.loss --activation_checkpoint.mode none
T=180 fits 180 ref cp4 0,1,2,3 $CP
T=180 fits 90 ours cp4 0,1,2,3 $CP --compile.loss $SAC
for r in fsdp2tp2_f8 fsdp4_acoff cp4; do windows $r; done
grep -E "step +(10|20|30)/" $out/logs/ours_fsdp2tp2_f8_plain_tp.log | sed 's/^\[rank0\]://' | cut -c1-150
grep -hE "float8 \+ TP|Applied .*Tensor Parallelism|all-gathered in" $out/logs/*fsdp2tp2*.log | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-160 | sort | uniq
pack
