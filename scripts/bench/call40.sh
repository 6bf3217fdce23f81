#!/usr/bin/env bash
# Call 40 (4 GPUs): the remaining bf16 rows of issue 14 after FSDP stopped casting the blocks'
# arguments (call 36): 8B FSDP4 with AC off, 8B FSDP2xTP2 with selective AC (30 steps each),
# then 8B PP2 (Interleaved1F1B, 8 microbatches) x FSDP2 (20 steps, steps 11-20). No kernel tuning.
# As it ran, `fits` skipped the reference's PP2 run (budget 540 s); it ran right after on the same
# warm machine, as the same `ref pp2 0,1,2,3 $PP` line with T=170 (docs/benchmarks.md).
source scripts/bench/lib.sh
card
S=$ROW_8K
T=150 fits 150 ours fsdp4_acoff 0,1,2,3 $S --compile.loss --activation_checkpoint.mode none
T=150 fits 150 ref fsdp4_acoff 0,1,2,3 $S --activation_checkpoint.mode none
windows fsdp4_acoff
TP="$S --parallelism.tensor_parallel_degree 2"
T=150 fits 150 ours fsdp2tp2 0,1,2,3 $TP --compile.loss $SAC
T=150 fits 150 ref fsdp2tp2 0,1,2,3 $TP
windows fsdp2tp2
PP=$PP2_ROW
T=150 fits 150 ours pp2 0,1,2,3 $PP --compile.loss $SAC
T=150 fits 150 ref pp2 0,1,2,3 $PP
windows pp2
pack
