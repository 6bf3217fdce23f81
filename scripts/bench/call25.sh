#!/usr/bin/env bash
# Call 25 (4 GPUs). --compile.reorder_collectives (inductor's peak-memory-preserving comm
# reordering) for 8B CP4 at 32k, where call 24's trace had ~100 ms per step of CP's K/V-gradient
# exchange with no computation beside it: ours with it, the reference, ours without (20 steps,
# steps 11-20); then 8B FSDP2xTP2 bf16 with it (30 steps; call 20: ref 7,828, ours 7,981).
source scripts/bench/lib.sh
card
CP=$CP4_ROW
T=150 fits 450 ours cp4_reorder 0,1,2,3 $CP --compile.loss $SAC --compile.reorder_collectives
T=150 fits 330 ref cp4 0,1,2,3 $CP
T=150 fits 210 ours cp4 0,1,2,3 $CP --compile.loss $SAC
windows cp4
grep -E "step +(10|20)/" $out/logs/ours_cp4_reorder.log | sed 's/^\[rank0\]://' | cut -c1-150
S="--training.steps 30 --training.seq_len 8192 --compile.enable --parallelism.tensor_parallel_degree 2"
T=170 fits 160 ours fsdp2tp2_reorder 0,1,2,3 $S --compile.loss $SAC --compile.reorder_collectives
grep -E "step +(10|20|30)/" $out/logs/ours_fsdp2tp2_reorder.log | sed 's/^\[rank0\]://' | cut -c1-150
pack
