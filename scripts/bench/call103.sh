#!/usr/bin/env bash
# Call 103 (4 GPUs): prepared on 2026-11-29 (only one-GPU machines were lent then), not run yet.
# #14's 8B FSDP4 bf16 rows with the default all-gather (`auto`, which picks the copy engines for
# this layout; measured so far only with --parallelism.fsdp_all_gather copy_engines): selective
# AC and AC off, each against the reference in the same call.
# Since commit f53c44c our runs also take the Triton gradient copy-in (--parallelism.fsdp_grad_copy_in
# triton, the default; call117.sh measures it against FSDP's own on this layout).
source scripts/bench/lib.sh
card
S=$ROW_8K
T=135 fits 135 ours fsdp4_sac 0,1,2,3 $S --compile.loss $SAC
T=135 fits 135 ref fsdp4_sac 0,1,2,3 $S
T=135 fits 135 ref fsdp4_acoff 0,1,2,3 $S --activation_checkpoint.mode none
T=135 fits 135 ours fsdp4_acoff 0,1,2,3 $S --compile.loss --activation_checkpoint.mode none
windows fsdp4_sac
windows fsdp4_acoff
pack
