#!/usr/bin/env bash
# Call 91 (one H200): a trial, not kept (docs/performance.md, finding 32). CompiledAdamW's step
# as one compiled call for all parameters (the per-parameter loop traced into one graph,
# `torch.compile(_adam_update_all, fullgraph=True)`), first timed by optimizer_step.py (killed
# at 150 s while compiling), then the 1B Float8 row (AC off, batch 4, tensorwise) with it, in the
# order ours, ref, ours. That code was reverted; this script now runs the current code.
source scripts/bench/lib.sh
card
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$site:$root timeout 150 python3 scripts/bench/optimizer_step.py --flavor 1B --compiled-kernels --iters 10 2>&1 | grep -v -i warn | tail -12
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=150 fits 150 ours f8_a 0 $ACO --compile.loss --float8.enable
T=115 fits 115 ref f8 0 $ACO --model.flavor 1B $REF_F8
T=150 fits 150 ours f8_b 0 $ACO --compile.loss --float8.enable
windows f8
for r in f8_a f8_b; do echo $r; grep -E "INFO step +(1|10|20|30)/" $out/logs/ours_$r.log | sed 's/^\[rank0\]://' | cut -c1-150; done
pack
