#!/usr/bin/env bash
# Call 72 (4 GPUs): FSDP's float8 all-gather casts each weight shard in one kernel of ours
# (torchtitan/parallel/float8_all_gather.py; call 71's traces: torchao's three eager kernels a
# weight, about 55 ms a step on FSDP's copy-in stream). Its GPU test, then 8B FSDP4 Float8
# tensorwise selective AC (float8 all-gather, precomputed scales): ours (the default), the
# reference, ours with torchao's cast (--float8.fused_all_gather_cast false); then ours with AC
# off if time is left.
source scripts/bench/lib.sh
card
T=90 gpu_test f8_cast_test 0 "tests/gpu/test_float8_cast_on_gpu.py -k kernel"
grep -E "passed|failed|Error" $out/logs/f8_cast_test.log | tail -4
S=$ROW_8K
T=135 fits 135 ours fsdp4_f8 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP
T=135 fits 135 ref fsdp4_f8 0,1,2,3 $S $REF_F8_FSDP
T=135 fits 135 ours fsdp4_f8_aocast 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP --float8.fused_all_gather_cast false
windows fsdp4_f8
grep -E "INFO step +(10|20|30)/" $out/logs/ours_fsdp4_f8_aocast.log | cut -c1-150
T=135 fits 135 ours fsdp4_f8_acoff 0,1,2,3 $S --compile.loss $OURS_F8_FSDP --activation_checkpoint.mode none
grep -E "INFO step +(10|20|30)/|rror" $out/logs/ours_fsdp4_f8_acoff.log | cut -c1-150 | tail -4
pack
