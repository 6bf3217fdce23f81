#!/usr/bin/env bash
# Call 44 (4 GPUs): 8B PP2 (Interleaved1F1B, 8 microbatches) x FSDP2 with the sharded embedding
# (now the default without TP) against the reference.
source scripts/bench/lib.sh
card
T=170 fits 170 ours pp2 0,1,2,3 $PP2_ROW --compile.loss $SAC
T=170 fits 170 ref pp2 0,1,2,3 $PP2_ROW
windows pp2
pack
