#!/usr/bin/env bash
# Call 45 (4 GPUs): the Float8 FSDP4 rows not yet measured with the sharded embedding (now the
# default without TP): tensorwise with AC off, and rowwise with selective AC, each against the
# reference.
source scripts/bench/lib.sh
card
S=$ROW_8K
T=140 fits 140 ours fsdp4_f8_acoff 0,1,2,3 $S --compile.loss $OURS_F8_FSDP --activation_checkpoint.mode none
T=140 fits 140 ref fsdp4_f8_acoff 0,1,2,3 $S $REF_F8_FSDP --activation_checkpoint.mode none
windows fsdp4_f8_acoff
T=140 fits 140 ours fsdp4_rowwise 0,1,2,3 $S --compile.loss $SAC --float8.enable --float8.recipe rowwise
T=140 fits 140 ref fsdp4_rowwise 0,1,2,3 $S $REF_F8 --quantize.linear.float8.recipe_name rowwise
windows fsdp4_rowwise
pack
