#!/usr/bin/env bash
# Call 3: 8B FSDP4 bf16 and Float8 (all linears but the head) side by side; 1B fused loss vs
# plain and the async-TP probe, concurrently; then 8B FSDP4 memory snapshots of both sides.
source scripts/bench/lib.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
S="--training.steps 30 --training.seq_len 8192"
F8R="--model.converters quantize.linear.float8 --quantize.linear.float8.enable_fsdp_float8_all_gather --quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp"
F8O="--float8.enable --float8.fsdp_float8_all_gather --float8.precompute_scales --float8.skip_small false"
SAC="--activation_checkpoint.mode selective --activation_checkpoint.save_matmuls alternate"
T=150 fits 300 ref fsdp4_sac 0,1,2,3 $S --compile.enable
T=150 fits 150 ours fsdp4_sac 0,1,2,3 $S --compile.enable --compile.loss $SAC
T=150 fits 300 ref fsdp4_f8 0,1,2,3 $S --compile.enable $F8R
T=150 fits 150 ours fsdp4_f8 0,1,2,3 $S --compile.enable --compile.loss $SAC $F8O
if (( DEADLINE - $(date +%s) > 120 )); then
  (CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=$site:$root timeout 110 python3 -m pytest -q -s tests/gpu/test_async_tp.py > $out/logs/async_tp.log 2>&1; echo "async tp rc=$?"; grep -E "ASYNC_TP|sync:|passed|failed|Error" $out/logs/async_tp.log | head -6) &
  B1="--training.steps 30 --training.seq_len 8192 --compile.enable --compile.loss --training.local_batch_size 4 --activation_checkpoint.mode none"
  CONFIG_FILE=train_configs/llama3_1b.toml T=110 ours 1b_plain 2 $B1 &
  CONFIG_FILE=train_configs/llama3_1b.toml T=110 ours 1b_chunked 3 $B1 --training.loss_chunk_tokens 4096 &
  wait
fi
M="--training.steps 12 --training.seq_len 8192 --profiling.enable_memory_snapshot --profiling.profile_freq 12"
T=90 fits 180 ref fsdp4_mem 0,1,2,3 $M --compile.enable
T=90 fits 90 ours fsdp4_mem 0,1,2,3 $M --compile.enable --compile.loss $SAC
for s in ref ours; do
  f=$(ls /tmp/${s}_fsdp4_mem/memory_snapshot/iteration_12/rank0_memory_snapshot.pickle 2>/dev/null) && \
    python3 scripts/memory_summary.py $f --top 22 > $out/logs/mem8b_$s.txt 2>&1 && cut -c1-150 $out/logs/mem8b_$s.txt
done
pack
