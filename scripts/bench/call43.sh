#!/usr/bin/env bash
# Call 43 (4 GPUs): the rows not yet measured with the sharded embedding (now the default
# without TP): 8B CP4 at seq 32768 and 8B FSDP4 with AC off, each against the reference.
source scripts/bench/lib.sh
card
T=190 fits 190 ours cp4 0,1,2,3 $CP4_ROW --compile.loss $SAC
T=170 fits 170 ref cp4 0,1,2,3 $CP4_ROW
windows cp4
T=130 fits 130 ours fsdp4_aco 0,1,2,3 $ROW_8K --compile.loss --activation_checkpoint.mode none
T=130 fits 130 ref fsdp4_aco 0,1,2,3 $ROW_8K --activation_checkpoint.mode none
windows fsdp4_aco
pack
