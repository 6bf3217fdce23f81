#!/usr/bin/env bash
# Call 14 (4 GPUs; prepared, not run yet): the 8B rows of issue #14 not re-measured since the
# logits release and the RMSNorm change: FSDP4 AC off, FSDP2xTP2 and PP2xFSDP2 (Interleaved1F1B,
# batch 8, microbatch 1), bf16, side by side. call15.sh has CP4 and the 1B rows.
source scripts/bench/lib.sh
card
S=$ROW_8K
PP="--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule Interleaved1F1B --training.local_batch_size 8 --parallelism.pipeline_parallel_microbatch_size 1"
T=150 fits 330 ref fsdp4_acoff 0,1,2,3 $S --activation_checkpoint.mode none
T=150 fits 270 ours fsdp4_acoff 0,1,2,3 $S --compile.loss --activation_checkpoint.mode none
T=150 fits 300 ref fsdp2tp2 0,1,2,3 $S --parallelism.tensor_parallel_degree 2
T=150 fits 150 ours fsdp2tp2 0,1,2,3 $S --compile.loss $SAC --parallelism.tensor_parallel_degree 2
T=170 fits 330 ref pp2 0,1,2,3 $S $PP
T=170 fits 170 ours pp2 0,1,2,3 $S --compile.loss $SAC $PP
for r in fsdp4_acoff fsdp2tp2 pp2; do windows $r; done
pack
