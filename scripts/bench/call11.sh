#!/usr/bin/env bash
# Call 11 (4 GPUs): why our 8B FSDP4 rowwise Float8 run of call 10 diverged from step 1
# (grad norm 1e5). 1B on two GPUs (FSDP2: bf16 compute weights, as at 8B), two runs at a time:
# ours as in call 10 beside the reference's rowwise; then ours with the RMSNorm written out
# (the tree before the F.rms_norm change, .bench/oldnorm) beside ours without AC and compile.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
S="--training.steps 10 --training.seq_len 8192 --training.local_batch_size 2"
RW_OURS="--float8.enable --float8.recipe rowwise"
T=150 ours rw_sac_compile 0,1 $S --compile.enable --compile.loss $SAC $RW_OURS &
T=150 ref rw 2,3 $S --model.flavor 1B --compile.enable $REF_F8 --quantize.linear.float8.recipe_name rowwise &
wait
(root=$root/.bench/oldnorm; T=150 ours rw_oldnorm_sac_compile 0,1 $S --compile.enable --compile.loss $SAC $RW_OURS) &
T=150 ours rw_eager_noac 2,3 $S --activation_checkpoint.mode none $RW_OURS &
wait
for r in ours_rw_sac_compile ref_rw ours_rw_oldnorm_sac_compile ours_rw_eager_noac; do
  echo "== $r"; sed 's/\x1b\[[0-9;]*m//g' $out/logs/$r.log | grep -E "step:? +(1|10)[ /]|rror" | sed 's/.*\(step\)/\1/' | cut -c1-120 | head -4
done
pack
