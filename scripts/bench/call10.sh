#!/usr/bin/env bash
# Call 10 (4 GPUs): after the RMSNorm change (F.rms_norm), 8B side by side, selective AC,
# no profiler: FSDP4 Float8 (tensorwise + float8 all-gather + precomputed scales), FSDP4 bf16,
# FSDP2xTP2 Float8 (float8 TP styles on our side; the reference v0.2.2 keeps plain ones with this
# converter name, docs/float8.md), FSDP4 Float8 rowwise.
source scripts/bench/lib.sh
card
S=$ROW_8K
TP2="--parallelism.tensor_parallel_degree 2"
T=150 fits 100 ref fsdp4_f8 0,1,2,3 $S $REF_F8_FSDP
T=150 fits 100 ours fsdp4_f8 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP
T=150 fits 100 ref fsdp4_bf16 0,1,2,3 $S
T=150 fits 100 ours fsdp4_bf16 0,1,2,3 $S --compile.loss $SAC
T=150 fits 100 ref fsdp2tp2_f8 0,1,2,3 $S $TP2 $REF_F8_FSDP
T=150 fits 100 ours fsdp2tp2_f8 0,1,2,3 $S $TP2 --compile.loss $SAC $OURS_F8_FSDP
T=150 fits 160 ref fsdp4_rowwise 0,1,2,3 $S $REF_F8 --quantize.linear.float8.recipe_name rowwise
T=150 fits 70 ours fsdp4_rowwise 0,1,2,3 $S --compile.loss $SAC --float8.enable --float8.recipe rowwise
for r in fsdp4_f8 fsdp4_bf16 fsdp2tp2_f8 fsdp4_rowwise; do windows $r; done
grep -hE "float8|Error|error:" $out/logs/ours_fsdp2tp2_f8.log | grep -v Warning | head -6
pack
