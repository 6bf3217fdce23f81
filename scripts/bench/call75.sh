#!/usr/bin/env bash
# Call 75 (4 GPUs, right after call 74): 8B PP2 x FSDP2 (Interleaved1F1B, 8 microbatches) bf16,
# ours (NCCL all-gather: copy_engines is refused under PP) against the reference.
source scripts/bench/lib.sh
card
T=150 fits 150 ours pp2 0,1,2,3 $PP2_ROW --compile.loss $SAC
T=150 fits 150 ref pp2 0,1,2,3 $PP2_ROW
windows pp2
pack
