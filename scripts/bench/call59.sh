#!/usr/bin/env bash
# Call 59 (4 GPUs, 265 s of device time left): the memory of 8B FSDP2xTP2 Float8 (selective AC)
# with the in-place loss under loss parallel, the one criterion that row missed (+0.10 GiB over
# the reference's 44.34 GiB in call 32, with the standard loss). 12 steps: the peak comes in the
# first steps; too few for a tokens/s figure.
source scripts/bench/lib.sh
card
S="--training.steps 12 --training.seq_len 8192 --compile.enable --parallelism.tensor_parallel_degree 2"
T=150 fits 150 ours fsdp2tp2_f8_mem 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP
grep -E "INFO step +(1|5|10|12)/" $out/logs/ours_fsdp2tp2_f8_mem.log | cut -c1-170
pack
