#!/usr/bin/env bash
# Call 6 (2 GPUs): the 1B rows side by side after the compiled optimizer, the logits release and
# Float8 on every linear (one GPU per framework, concurrently), then 1B FSDP2 Float8 (float8
# all-gather + precomputed scales) with profiler traces.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
S=$ROW_8K
B4="--training.local_batch_size 4 --activation_checkpoint.mode none"
T=170 ref 1b_sac 0 $S --model.flavor 1B --training.local_batch_size 2 &
T=170 ours 1b_sac 1 $S --compile.loss --training.local_batch_size 2 $SAC &
wait
T=170 ref 1b_acoff 0 $S --model.flavor 1B $B4 &
T=170 ours 1b_acoff 1 $S --compile.loss $B4 &
wait
T=170 ref 1b_f8 0 $S --model.flavor 1B $B4 $REF_F8 &
T=170 ours 1b_f8 1 $S --compile.loss $B4 --float8.enable --float8.skip_small false &
wait
T=170 fits 200 ours 1b_f8_skipsmall 0 $S --compile.loss $B4 --float8.enable &
T=170 fits 200 ours 1b_acoff_fused 1 $S --compile.loss $B4 --optimizer.implementation fused &
wait
T=140 fits 140 ref 1b_fsdp2_f8 0,1 $S --model.flavor 1B --training.local_batch_size 2 $REF_F8_FSDP $REF_PROFILE_30
T=140 fits 140 ours 1b_fsdp2_f8 0,1 $S --compile.loss --training.local_batch_size 2 $SAC $OURS_F8_FSDP --float8.skip_small false $PROFILE_30
windows 1b_fsdp2_f8
traces 1b_fsdp2_f8 30 12
grep -E "Error|error" $out/logs/ours_*.log | grep -v "^.*warn" | head -5
pack
