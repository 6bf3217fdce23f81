#!/usr/bin/env bash
# Call 89 (one H200): the 1B Float8 row (AC off, batch 4) with the fused AdamW kernel against the
# compiled one that `auto` picked for whole parameters (call 88: fused 1.5x faster on H200), in
# the order ours fused, reference, ours auto (compiled), ours fused.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=115 fits 115 ours f8_fused_a 0 $ACO --compile.loss --float8.enable --optimizer.implementation fused
T=115 fits 115 ref f8 0 $ACO --model.flavor 1B $REF_F8
T=115 fits 115 ours f8_auto 0 $ACO --compile.loss --float8.enable
T=115 fits 115 ours f8_fused_b 0 $ACO --compile.loss --float8.enable --optimizer.implementation fused
grep -h "optimizer" $out/logs/ours_f8_auto.log $out/logs/ours_f8_fused_a.log | head -2 | cut -c1-200
windows f8
for r in f8_auto f8_fused_a f8_fused_b; do echo $r; grep -E "INFO step +(10|20|30)/" $out/logs/ours_$r.log | sed 's/^\[rank0\]://' | cut -c1-150; done
pack
