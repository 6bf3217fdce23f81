#!/usr/bin/env bash
# Call 57 (2 GPUs): finding 23 continued. (1) 1B selective AC batch 2, ours beside the reference,
# both orders. (2) 1B TP2 (autocast without FSDP: the residual cast under TP), 20 steps. (3) One
# compiled 1B block (scripts/bench/block_step.py), each GPU one list in turn: the RoPE forms and
# the residual stream's dtype, Float8 on GPU 0, bf16 on GPU 1.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
SAC2="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 2"
pair "ours sac_g0 0 $SAC2 --compile.loss $SAC" "ref sac_g1 1 $SAC2 --model.flavor 1B"
pair "ours sac_g1 1 $SAC2 --compile.loss $SAC" "ref sac_g0 0 $SAC2 --model.flavor 1B"
for r in sac_g0 sac_g1; do windows $r; done
TP="--training.steps 20 --training.seq_len 8192 --compile.enable --training.local_batch_size 2 --parallelism.tensor_parallel_degree 2"
T=120 fits 120 ours tp2 0,1 $TP --compile.loss
grep -E "INFO step +(1|10|20)/" $out/logs/ours_tp2.log | cut -c1-170
SHOW=6
blk() { block_step $1 $2 ours "${@:3}"; }  # blk NAME GPU ARGS...: our block
(
  fits 80 blk f8_pairs32 0 --float8 --rope pairs --residual float32
  fits 80 blk f8_swap32 0 --float8 --rope swap --residual float32
  fits 80 blk f8_swap16 0 --float8 --rope swap --residual bfloat16
  fits 80 blk f8_pairs32b 0 --float8 --rope pairs --residual float32
) > $out/gpu0.txt 2>&1 &
p0=$!
(
  fits 80 blk bf_pairs32 1 --rope pairs --residual float32
  fits 80 blk bf_swap32 1 --rope swap --residual float32
  fits 80 blk bf_swap16 1 --rope swap --residual bfloat16
  fits 80 blk bf_pairs32b 1 --rope pairs --residual float32
) > $out/gpu1.txt 2>&1 &
wait $p0 $!
grep -h "==\|forward+backward" $out/gpu0.txt $out/gpu1.txt
pack
