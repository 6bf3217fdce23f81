#!/usr/bin/env bash
# Call 26 (4 GPUs). --compile.reorder_collectives is now the default: 8B FSDP2xTP2 bf16 side by
# side (30 steps), and ours with it off; then the 1B one-GPU rows (untouched by the change: no
# collective in a compiled block) concurrently, for memory to two decimals.
source scripts/bench/lib.sh
card
S="--training.steps 30 --training.seq_len 8192 --compile.enable --parallelism.tensor_parallel_degree 2"
T=170 fits 430 ours fsdp2tp2 0,1,2,3 $S --compile.loss $SAC
T=170 fits 300 ref fsdp2tp2 0,1,2,3 $S
T=170 fits 170 ours fsdp2tp2_noreorder 0,1,2,3 $S --compile.loss $SAC --compile.reorder_collectives false
windows fsdp2tp2
grep -E "step +(10|20|30)/" $out/logs/ours_fsdp2tp2_noreorder.log | sed 's/^\[rank0\]://' | cut -c1-150
if (( DEADLINE - $(date +%s) > 115 )); then
  (export CONFIG_FILE=train_configs/llama3_1b.toml
  S1="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
  T=105 ref 1b_f8 0 $S1 --model.flavor 1B $REF_F8 &
  T=105 ours 1b_f8 1 $S1 --compile.loss --float8.enable &
  T=105 ref 1b_acoff 2 $S1 --model.flavor 1B &
  T=105 ours 1b_acoff 3 $S1 --compile.loss &
  wait)
fi
for r in 1b_f8 1b_acoff; do windows $r; done
pack
