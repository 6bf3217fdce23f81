#!/usr/bin/env bash
# Call 2: 1B bf16 and Float8 rows on separate GPUs, Float8 vs bf16 loss curves from one seed, then 8B FSDP4 Float8 and bf16.
source scripts/bench/lib.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
S="--training.steps 30 --training.seq_len 8192"
export CONFIG_FILE=train_configs/llama3_1b.toml
# The seed for the loss curves, on the host CPU while wave 1 runs.
(PYTHONPATH=$site:$root python3 -m torchtitan.train --job.config_file $CONFIG_FILE --training.seq_len 8192 \
  --checkpoint.create_seed_checkpoint --job.dump_folder /tmp/seed1b > $out/logs/seed.log 2>&1; echo "seed rc=$?") &
T=200 ref  1b_sac 0 $S --model.flavor 1B --compile.enable --training.local_batch_size 2 &
T=200 ours 1b_sac 1 $S --compile.enable --compile.loss --training.local_batch_size 2 --activation_checkpoint.mode selective --activation_checkpoint.save_matmuls alternate &
T=200 ref  1b_acoff 2 $S --model.flavor 1B --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none &
T=200 ours 1b_acoff 3 $S --compile.enable --compile.loss --training.local_batch_size 4 --activation_checkpoint.mode none &
wait
C="--training.steps 120 --metrics.log_freq 5 --lr_scheduler.warmup_steps 20 --training.local_batch_size 2 --compile.enable --compile.loss --activation_checkpoint.mode selective --activation_checkpoint.save_matmuls alternate --checkpoint.initial_load_path /tmp/seed1b/checkpoint/step-0"
T=200 ref  1b_f8 0 $S --model.flavor 1B --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none --model.converters quantize.linear.float8 &
T=200 ours 1b_f8 1 $S --compile.enable --compile.loss --training.local_batch_size 4 --activation_checkpoint.mode none --float8.enable &
T=230 ours curve_bf16 2 $C &
T=230 ours curve_f8 3 $C --float8.enable &
wait
python3 scripts/compare_loss_curves.py /tmp/ours_curve_bf16 /tmp/ours_curve_f8 2>&1 | tail -4
mkdir -p $out/logs/curves && cp /tmp/ours_curve_*/metrics/*.jsonl $out/logs/curves/ 2>/dev/null
for f in /tmp/ours_curve_*/metrics/*.jsonl; do cp $f $out/logs/curves/$(basename $(dirname $(dirname $f))).jsonl; done
unset CONFIG_FILE
F8R="--model.converters quantize.linear.float8 --quantize.linear.float8.enable_fsdp_float8_all_gather --quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp"
F8O="--float8.enable --float8.fsdp_float8_all_gather --float8.precompute_scales"
SAC="--activation_checkpoint.mode selective --activation_checkpoint.save_matmuls alternate"
T=240 fits 400 ref fsdp4_f8 0,1,2,3 $S --compile.enable $F8R
T=240 fits 200 ours fsdp4_f8 0,1,2,3 $S --compile.enable --compile.loss $SAC $F8O
T=240 fits 400 ref fsdp4_sac 0,1,2,3 $S --compile.enable
T=240 fits 200 ours fsdp4_sac 0,1,2,3 $S --compile.enable --compile.loss $SAC
pack
