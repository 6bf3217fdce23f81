#!/usr/bin/env bash
# Call 53 (2 GPUs; call 52 hung after its first pair: its `wait` also waited for the nvidia-smi
# logger, so only the A/B pair with standard on GPU 0 came back). (1) The in-place loss A/B with
# the GPUs swapped: 1B AC off batch 4, ours --training.logits_loss standard on GPU 1 beside ours
# (in place) on GPU 0. (2) If time is left: 1B AC off with --compile.tune_kernels on GPU 1
# against the reference on GPU 0 (the GPU the reference ran faster on in call 51).
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=100 fits 100 ours std_b 1 $ACO --compile.loss --training.logits_loss standard &
T=100 fits 100 ours inp_b 0 $ACO --compile.loss &
wait
for r in std_b inp_b; do echo "ours $r"; grep -E "INFO step +(10|20|30)/" $out/logs/ours_$r.log | cut -c1-160; done
T=135 fits 135 ours 1b_tuned 1 $ACO --compile.loss --compile.tune_kernels &
T=135 fits 135 ref 1b_tuned 0 $ACO --model.flavor 1B &
wait
windows 1b_tuned
pack
