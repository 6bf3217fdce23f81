#!/usr/bin/env bash
# Call 102 (4 GPUs): prepared on 2026-11-29 (only one-GPU machines were lent then), not run yet.
# #13's two 8B FSDP4 Float8 rows not re-measured with the current defaults: rowwise under
# selective AC (our rowwise backward, the column scales in the cast kernel, `auto`'s copy-engine
# all-gather) and tensorwise without AC (our backward, its casts recomputed since call 85), each
# against the reference in the same call.
# Since commit f53c44c our runs also take the Triton gradient copy-in (--parallelism.fsdp_grad_copy_in
# triton, the default; call117.sh measures it against FSDP's own on this layout).
source scripts/bench/lib.sh
card
S=$ROW_8K
T=135 fits 135 ref fsdp4_rowwise 0,1,2,3 $S $REF_F8 --quantize.linear.float8.recipe_name rowwise
T=135 fits 135 ours fsdp4_rowwise 0,1,2,3 $S --compile.loss $SAC --float8.enable --float8.recipe rowwise
T=135 fits 135 ours fsdp4_f8_acoff 0,1,2,3 $S --compile.loss $OURS_F8_FSDP --activation_checkpoint.mode none
T=135 fits 135 ref fsdp4_f8_acoff 0,1,2,3 $S $REF_F8_FSDP --activation_checkpoint.mode none
windows fsdp4_rowwise
windows fsdp4_f8_acoff
pack
