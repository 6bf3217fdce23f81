#!/usr/bin/env bash
# Call 8 (2 GPUs): 1B TP2 with Float8 tensorwise on every block linear (the default since
# skip_small is off), so TP moves float8 activations (torchao's float8 TP styles), side by side.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
S="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 2 --parallelism.tensor_parallel_degree 2"
T=150 fits 150 ref 1b_tp2_f8 0,1 $S --model.flavor 1B --parallelism.data_parallel_shard_degree 1 $REF_F8
T=150 fits 150 ours 1b_tp2_f8 0,1 $S --compile.loss $SAC --float8.enable
grep -E "float8|step +(10|20|30)/" $out/logs/ours_1b_tp2_f8.log | grep -v validation | sed 's/^\[rank0\]://' | cut -c1-220
grep -E "Error|error:" $out/logs/ours_1b_tp2_f8.log | head -5
pack
