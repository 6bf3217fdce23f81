#!/usr/bin/env bash
# Call 42 (4 GPUs): (1) 1B selective AC, batch 2, one GPU each, concurrently: ours as is, ours
# with inductor's matmul autotuning (TORCHINDUCTOR_MAX_AUTOTUNE_GEMM: Triton templates against
# cuBLAS, with epilogue fusion), the same plus Hopper's persistent TMA template and coordinate
# descent, and the reference. (2) 8B FSDP4 Float8 with the sharded embedding (now the default)
# against the reference.
source scripts/bench/lib.sh
card
S1="$ROW_8K --training.local_batch_size 2"
export CONFIG_FILE=train_configs/llama3_1b.toml
T=330 fits 330 ours 1b 0 $S1 --compile.loss $SAC &
(export TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1; T=330 fits 330 ours 1b_mag 1 $S1 --compile.loss $SAC) &
(export TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1 ENABLE_PERSISTENT_TMA_MATMUL=1
 T=330 fits 330 ours 1b_mag_tma_cd 2 $S1 --compile.loss $SAC --compile.tune_kernels) &
T=330 fits 330 ref 1b 3 $S1 --model.flavor 1B &
wait
unset CONFIG_FILE
windows 1b
for r in 1b_mag 1b_mag_tma_cd; do
  echo "ours $r"; grep -E "INFO step +(10|20|30)/" $out/logs/ours_$r.log | cut -c1-150
  grep -c "AUTOTUNE" $out/logs/ours_$r.log
done
S=$ROW_8K
T=150 fits 150 ours fsdp4_f8 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP
T=150 fits 150 ref fsdp4_f8 0,1,2,3 $S $REF_F8_FSDP
windows fsdp4_f8
pack
