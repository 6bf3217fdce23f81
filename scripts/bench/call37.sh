#!/usr/bin/env bash
# Call 37 (4 GPUs): where 8B FSDP4 bf16 selective AC spends its step on both sides (traces of
# step 30), beside two one-GPU timings run first: attention forward + backward per SDPA backend
# at the models' shapes, and the optimizer step on an 8B FSDP4 shard.
source scripts/bench/lib.sh
card
(PYTHONPATH=$site:$root CUDA_VISIBLE_DEVICES=0 timeout 150 python3 scripts/bench/attention_backends.py \
  > $out/logs/attention.log 2>&1; echo "attention rc=$?") &
(PYTHONPATH=$site:$root CUDA_VISIBLE_DEVICES=1 timeout 150 python3 scripts/bench/optimizer_step.py \
  --flavor 8B --shard 4 --device cuda > $out/logs/optimizer.log 2>&1; echo "optimizer rc=$?") &
wait
cat $out/logs/attention.log $out/logs/optimizer.log | cut -c1-150
S=$ROW_8K
T=150 fits 150 ours fsdp4 0,1,2,3 $S --compile.loss $SAC $PROFILE_30
T=150 fits 150 ref fsdp4 0,1,2,3 $S $REF_PROFILE_30
windows fsdp4
traces fsdp4 30 25
pack
