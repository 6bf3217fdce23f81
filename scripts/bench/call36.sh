#!/usr/bin/env bash
# Call 36 (4 GPUs): after FSDP stopped casting the blocks' arguments (the float32 RoPE cache was
# copied to bf16 per block; call 34's snapshot: +0.06 GiB allocated on 8B FSDP4), 8B FSDP4 bf16
# selective AC and PP2 (Interleaved1F1B, 8 microbatches) x FSDP2 side by side.
source scripts/bench/lib.sh
card
S=$ROW_8K
T=150 fits 150 ours fsdp4 0,1,2,3 $S --compile.loss $SAC
T=150 fits 150 ref fsdp4 0,1,2,3 $S
windows fsdp4
PP=$PP2_ROW
T=150 fits 260 ours pp2 0,1,2,3 $PP --compile.loss $SAC
T=150 fits 130 ref pp2 0,1,2,3 $PP
windows pp2
pack
