#!/usr/bin/env bash
# Call 56 (2 GPUs): finding 23 (the RoPE's pair swap, the residual stream in autocast's dtype on
# one GPU) on the 1B rows. Each row twice with the GPUs swapped, ours beside the reference (1B
# AC off, 1B Float8 AC off); then ours beside the code before the change (.bench/base: HEAD's
# torchtitan, run_train.sh and configs, carried), AC off, both orders.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
# base NAME GPUS ARGS...: `ours` run from the snapshot of the code before the change.
base() { (root=$root/.bench/base; ours base_$1 $2 "${@:3}"); }
pair "ours aco_g0 0 $ACO --compile.loss" "ref aco_g1 1 $ACO --model.flavor 1B"
pair "ours aco_g1 1 $ACO --compile.loss" "ref aco_g0 0 $ACO --model.flavor 1B"
pair "ours f8_g0 0 $ACO --compile.loss --float8.enable" "ref f8_g1 1 $ACO --model.flavor 1B $REF_F8"
pair "ours f8_g1 1 $ACO --compile.loss --float8.enable" "ref f8_g0 0 $ACO --model.flavor 1B $REF_F8"
pair "base aco_g0 0 $ACO --compile.loss" "ours new_aco_g1 1 $ACO --compile.loss"
pair "base aco_g1 1 $ACO --compile.loss" "ours new_aco_g0 0 $ACO --compile.loss"
for r in aco_g0 aco_g1 f8_g0 f8_g1; do windows $r; done
for r in base_aco_g0 base_aco_g1 new_aco_g0 new_aco_g1; do echo "ours $r"; grep -E "INFO step +(10|20|30)/" $out/logs/ours_$r.log | cut -c1-170; done
pack
