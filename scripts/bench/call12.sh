#!/usr/bin/env bash
# Call 12 (4 GPUs): 8B FSDP4 rowwise Float8 side by side (our call-10 run diverged from step 1,
# 1B FSDP2 rowwise did not in call 11), then ours without AC (is selective AC a factor?).
source scripts/bench/lib.sh
card
S=$ROW_8K
T=150 fits 200 ref fsdp4_rowwise 0,1,2,3 $S $REF_F8 --quantize.linear.float8.recipe_name rowwise
T=150 fits 100 ours fsdp4_rowwise 0,1,2,3 $S --compile.loss $SAC --float8.enable --float8.recipe rowwise
T=100 fits 100 ours fsdp4_rowwise_noac 0,1,2,3 $S --compile.loss --activation_checkpoint.mode none --float8.enable --float8.recipe rowwise --training.steps 12
for r in ref_fsdp4_rowwise ours_fsdp4_rowwise ours_fsdp4_rowwise_noac; do
  echo "== $r"; sed 's/\x1b\[[0-9;]*m//g' $out/logs/$r.log | grep -E "step:? +(1|10|20|30)[ /]|rror" | grep -v lspci | sed 's/.*\(step\)/\1/' | cut -c1-150 | head -6
done
pack
