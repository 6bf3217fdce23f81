#!/usr/bin/env bash
# Call 99 (one H200): out-of-sample points for the planner, 1B on one GPU in modes it models but
# had never been measured in (docs/planning.md, "Limits"). Its estimates, printed before this ran
# (commit 4686cd4, H200 card): full AC 28.8 GiB / 42,609 tokens/s; selective every 2nd block
# 47.9 / 47,702; Float8 tensorwise under selective AC 41.8 / 62,212; Float8 rowwise AC off
# 52.7 / 61,111; batch 8 under selective AC 65.5 / 52,479; eager under selective AC 43.9 / 39,410.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
B4="--training.steps 30 --training.seq_len 8192 --training.local_batch_size 4"
C="--compile.enable --compile.loss"
ALT="--activation_checkpoint.mode selective --activation_checkpoint.save_matmuls alternate"
T=110 fits 110 ours full 0 $B4 $C --activation_checkpoint.mode full
T=110 fits 110 ours every2 0 $B4 $C --activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option 2
T=110 fits 110 ours f8sac 0 $B4 $C $ALT --float8.enable
T=110 fits 110 ours rw 0 $B4 $C --activation_checkpoint.mode none --float8.enable --float8.recipe rowwise
T=110 fits 110 ours b8sac 0 $B4 $C $ALT --training.local_batch_size 8
T=90 fits 90 ours eager 0 $B4 $ALT
for n in full every2 f8sac rw b8sac eager; do
  echo "$n :: $(grep -E 'INFO step +(20|30)/' $out/logs/ours_$n.log 2>/dev/null | sed 's/^\[rank0\]://' | cut -c1-150 | tr '\n' ' ')"
done
pack
