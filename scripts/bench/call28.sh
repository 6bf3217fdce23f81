#!/usr/bin/env bash
# Call 28 (4 GPUs): experiments, ours only (no ratio claims from this call).
# 1. tests/gpu/test_async_tp.py on GPUs 0,1 (the TP group now registered for symmetric memory):
#    fused ops present, and the block's time per variant; concurrently, 1B selective AC batch 2 on
#    GPUs 2 and 3, default vs inductor coordinate-descent tuning of its Triton kernels.
# 2. 8B FSDP4 selective AC bf16: default vs NCCL_MAX_CTAS=8 (fewer SMs taken by the hidden
#    FSDP collectives), then coordinate-descent tuning if time is left.
source scripts/bench/lib.sh
card
T=250 gpu_test async_tp 0,1 tests/gpu/test_async_tp.py &
(export CONFIG_FILE=train_configs/llama3_1b.toml
 S1="--training.steps 30 --training.seq_len 8192 --compile.enable --compile.loss --training.local_batch_size 2 $SAC"
 T=170 ours 1b_sac 2 $S1 &
 TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 T=240 ours 1b_sac_cdt 3 $S1 &
 wait)
wait
grep -E "ASYNC_TP_RESULT|^(sync|async)|passed|failed|Error" $out/logs/async_tp.log | cut -c1-200 | head -20
for r in 1b_sac 1b_sac_cdt; do echo $r; grep -E "step +(10|20|30)/" $out/logs/ours_$r.log | sed 's/^\[rank0\]://' | cut -c1-150; done
S="--training.steps 30 --training.seq_len 8192 --compile.enable --compile.loss $SAC"
T=160 fits 160 ours fsdp4 0,1,2,3 $S
NCCL_MAX_CTAS=8 T=160 fits 160 ours fsdp4_ctas8 0,1,2,3 $S
TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 T=200 fits 200 ours fsdp4_cdt 0,1,2,3 $S
for r in fsdp4 fsdp4_ctas8 fsdp4_cdt; do echo $r; grep -E "step +(10|20|30)/" $out/logs/ours_$r.log 2>/dev/null | sed 's/^\[rank0\]://' | cut -c1-150; done
pack
