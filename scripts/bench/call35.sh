#!/usr/bin/env bash
# Call 35 (2 GPUs; no 4-GPU machine was lent): tests/gpu/test_async_tp.py with the batch-1 pre-pass
# reverted (its new value check and plain-again variant); then memory snapshots of the 1B
# selective-AC row (batch 2, step 12) on both sides, one GPU each, for our +0.04 GiB.
source scripts/bench/lib.sh
card
gpu_test async_tp 0,1 tests/gpu/test_async_tp.py
grep -E "ASYNC_TP_RESULT|^(sync|async)|passed|failed|Error" $out/logs/async_tp.log | cut -c1-220 | head -24
export CONFIG_FILE=train_configs/llama3_1b.toml
M="--training.steps 12 --training.seq_len 8192 --compile.enable --training.local_batch_size 2 --profiling.enable_memory_snapshot --profiling.profile_freq 12"
T=170 ref 1b_sac_mem 0 $M --model.flavor 1B &
T=170 ours 1b_sac_mem 1 $M --compile.loss $SAC &
wait
for run in ref_1b_sac_mem ours_1b_sac_mem; do memory $run 12 --top 18 --last 10; done
pack
