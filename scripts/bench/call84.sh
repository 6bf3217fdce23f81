#!/usr/bin/env bash
# Call 84 (2x H200): whether `auto` should give CP the copy-engine all-gather: 8B CP2 at seq
# 32768 under selective AC (CP4's row at half the degree), NCCL's all-gather then the copy
# engines, one after the other. Then the 1B Float8 row (1 GPU, AC off, batch 4) with the current
# code, ours beside the reference, then the GPUs swapped.
source scripts/bench/lib.sh
card
CP2="--training.steps 20 --training.seq_len 32768 --compile.enable --parallelism.context_parallel_degree 2"
T=170 fits 170 ours cp2_nccl 0,1 $CP2 --compile.loss $SAC --parallelism.fsdp_all_gather nccl
T=170 fits 170 ours cp2_ce 0,1 $CP2 --compile.loss $SAC --parallelism.fsdp_all_gather copy_engines
for r in ours_cp2_nccl ours_cp2_ce; do echo "$r"; grep -E "INFO step +(10|20)/" $out/logs/$r.log | sed 's/^\[rank0\]://' | cut -c1-150; done
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=110 pair "ours f8_g0 0 $ACO --compile.loss --float8.enable" "ref f8_g1 1 $ACO --model.flavor 1B $REF_F8"
T=110 pair "ours f8_g1 1 $ACO --compile.loss --float8.enable" "ref f8_g0 0 $ACO --model.flavor 1B $REF_F8"
for r in f8_g0 f8_g1; do windows $r; done
pack
