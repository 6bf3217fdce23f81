#!/usr/bin/env bash
# Call 41 (4 GPUs): the embedding looked up where its vocabulary rows live
# (--parallelism.fsdp_sharded_embedding) instead of FSDP's all-gather of the whole table and
# reduce-scatter of its whole float32 gradient, the step's first and last collectives. 8B FSDP4
# selective AC: ours without, ours with, the reference; then Float8 (tensorwise, float8 all-gather,
# precomputed scales) with it against the reference, if time is left. No kernel tuning.
source scripts/bench/lib.sh
card
S=$ROW_8K
SE=--parallelism.fsdp_sharded_embedding
T=150 fits 150 ours fsdp4 0,1,2,3 $S --compile.loss $SAC
T=150 fits 150 ours fsdp4_se 0,1,2,3 $S --compile.loss $SAC $SE
T=150 fits 150 ref fsdp4 0,1,2,3 $S
windows fsdp4
grep -E "INFO step +(10|20|30)/" $out/logs/ours_fsdp4_se.log | cut -c1-150
T=150 fits 150 ours fsdp4_f8_se 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP $SE
T=150 fits 150 ref fsdp4_f8 0,1,2,3 $S $REF_F8_FSDP
grep -E "INFO step +(10|20|30)/" $out/logs/ours_fsdp4_f8_se.log | cut -c1-150
grep -E "step: +(10|20|30) " $out/logs/ref_fsdp4_f8.log | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
pack
