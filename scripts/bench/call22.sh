#!/usr/bin/env bash
# Call 22 (4 GPUs): 8B CP4 at seq 32768, selective AC, 20 steps (steps 11-20): ring attention's
# K/V exchange as one all-gather (the default) against alltoall (passed around the ring while
# computing), the reference between them. (alltoall with compile is refused since: it hangs.)
source scripts/bench/lib.sh
card
CP=$CP4_ROW
T=150 fits 440 ours cp4 0,1,2,3 $CP --compile.loss $SAC
T=150 fits 300 ref cp4 0,1,2,3 $CP
T=150 fits 150 ours cp4_alltoall 0,1,2,3 $CP --compile.loss $SAC --parallelism.context_parallel_rotate_method alltoall
windows cp4
grep -E "step +(10|20)/" $out/logs/ours_cp4_alltoall.log | sed 's/^\[rank0\]://' | cut -c1-150
pack
