#!/usr/bin/env bash
# Call 90 (one H200): the 1B Float8 row (AC off, batch 4) with the compiled AdamW kernel's block
# size tuned by coordinate descent (call 88: 24.6 -> 17.3 ms for the step alone), in the order
# ours, reference, ours. Call 89 ran the untuned kernel on the same kind of machine. The tuning
# was a trial, not kept: compiled_adamw.compiled_update passed options={"coordinate_descent_tuning":
# True} to its torch.compile (docs/performance.md, finding 31).
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=115 fits 115 ours f8_a 0 $ACO --compile.loss --float8.enable
T=115 fits 115 ref f8_a 0 $ACO --model.flavor 1B $REF_F8
T=115 fits 115 ours f8_b 0 $ACO --compile.loss --float8.enable
windows f8_a
echo ours f8_b; grep -E "INFO step +(10|20|30)/" $out/logs/ours_f8_b.log | sed 's/^\[rank0\]://' | cut -c1-150
pack
