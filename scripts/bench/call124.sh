#!/usr/bin/env bash
# Call 124 (one H200): the fused float8 SwiGLU backward with call 123's tile settings: its GPU
# tests (the compiled-block test now against a bf16 block), then the 1B Float8 row (AC off,
# batch 4, tensorwise) on one GPU in the order reference, ours, ours with
# --float8.fused_swiglu false, ours.
# Result: GPU tests 5 passed; reference 62,572, ours 65,833 (1.052x), unfused 65,165 (1.041x),
# ours 65,866 (1.053x) tokens/s on steps 21-30; 52.00 / 51.98 GiB against 60.83.
source scripts/bench/lib.sh
card
T=150 fits 150 gpu_test swiglu 0 tests/gpu/test_float8_swiglu_on_gpu.py
grep -E "relative error|passed|failed|Error|assert" $out/logs/swiglu.log | cut -c1-200 | head -24
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
T=110 fits 110 ref f8 0 $ACO --model.flavor 1B $REF_F8
T=110 fits 110 ours f8 0 $ACO --compile.loss --float8.enable
T=110 fits 110 ours f8_unfused 0 $ACO --compile.loss --float8.enable --float8.fused_swiglu false
T=110 fits 110 ours f8_again 0 $ACO --compile.loss --float8.enable
windows f8
for r in f8_unfused f8_again; do echo "ours $r"; grep -E "INFO step +(10|20|30)/" $out/logs/ours_$r.log | sed 's/^\[rank0\]://' | cut -c1-160; done
grep -h "SwiGLU" $out/logs/ours_f8*.log | cut -c1-120
pack
