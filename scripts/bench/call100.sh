#!/usr/bin/env bash
# Call 100 (one H200): 1B Float8 rowwise without AC (batch 4) side by side, the reference then ours
# on the same GPU, then ours with torchao's rowwise backward (--float8.own_backward false): our
# rowwise backward and its column scales computed in the cast kernel (finding 33), in a trainer.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=120 fits 120 ref rw 0 $ACO --model.flavor 1B $REF_F8 --quantize.linear.float8.recipe_name rowwise
T=110 fits 110 ours rw 0 $ACO --compile.loss --float8.enable --float8.recipe rowwise
T=110 fits 110 ours rwao 0 $ACO --compile.loss --float8.enable --float8.recipe rowwise --float8.own_backward false
windows rw
grep -E 'INFO step +(20|30)/' $out/logs/ours_rwao.log | sed 's/^\[rank0\]://' | cut -c1-150
pack
