#!/usr/bin/env bash
# Call 87 (one H200): where the 1B Float8 row (AC off, batch 4, tensorwise) spends its step on
# both sides. One compiled 1B block per side (the one-GPU trainer's fp32 parameters under
# autocast; ours with our backward, the reference's with torchao's Float8Linear), then both
# trainers with a trace of step 30 (torch profiler), summarized by scripts/trace_summary.py.
source scripts/bench/lib.sh
card
SHOW=16
B1="--flavor 1B --batch 4 --iters 30 --top 16 --float8 --ac none"
T=90 fits 90 block_step f8_1b_ours 0 ours $B1
T=90 fits 90 block_step f8_1b_ref 0 ref $B1
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=120 fits 120 ref f8p 0 $ACO --model.flavor 1B $REF_F8 $REF_PROFILE_30
T=120 fits 120 ours f8p 0 $ACO --compile.loss --float8.enable $PROFILE_30
windows f8p
traces f8p 30 40
pack
