#!/usr/bin/env bash
# Call 70 (2 GPUs): 8B FSDP2 Float8 tensorwise (float8 all-gather, precomputed scales) under
# selective AC, ours with our float8 backward (the default), the reference, then ours with
# torchao's backward (--float8.own_backward false) if time is left; one after the other on both.
source scripts/bench/lib.sh
card
S=$ROW_8K
T=150 fits 150 ours fsdp2_f8 0,1 $S --compile.loss $SAC $OURS_F8_FSDP
T=150 fits 150 ref fsdp2_f8 0,1 $S $REF_F8_FSDP
T=150 fits 150 ours fsdp2_f8_torchao 0,1 $S --compile.loss $SAC $OURS_F8_FSDP --float8.own_backward false
for r in fsdp2_f8 fsdp2_f8_torchao; do windows $r; done
pack
