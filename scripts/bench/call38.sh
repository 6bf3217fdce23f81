#!/usr/bin/env bash
# Call 38 (4 GPUs): GPU time of the gradient norm, clipping and optimizer step inside training
# runs, both sides (scripts/bench/step_timing: CUDA events around torch's get_total_norm,
# clip_grads_with_norm_ and AdamW.step, median of steps 11-30). Call 37's traces showed 67-70 ms
# of optimizer kernels per profiled 8B FSDP4 step on both sides, against 21-23 ms for the same
# update timed alone on an 8B shard. 1B (one GPU each, concurrently), then 8B FSDP4.
source scripts/bench/lib.sh
card
export STEP_TIMING=1 PREPEND_PATH=$root/scripts/bench/step_timing
S1=$ROW_8K
CONFIG_FILE=train_configs/llama3_1b.toml T=200 fits 200 ours 1b 0 $S1 --compile.loss $SAC --training.local_batch_size 2 &
T=200 fits 200 ref 1b 1 $S1 --model.flavor 1B --training.local_batch_size 2 &
wait
S=$ROW_8K
T=150 fits 150 ours fsdp4 0,1,2,3 $S --compile.loss $SAC
T=150 fits 150 ref fsdp4 0,1,2,3 $S
for run in ours_1b ref_1b ours_fsdp4 ref_fsdp4; do echo "$run"; grep -h "STEP_TIMING" $out/logs/$run.log | sed 's/^\[rank0\]://'; done
windows 1b
windows fsdp4
pack
