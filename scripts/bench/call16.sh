#!/usr/bin/env bash
# --optimizer.overlap_forward ran at commit 27489a0 and was removed in the next commit (it bought
# +0.5% on bf16 at +2.1 GiB and nothing on Float8: docs/performance.md, finding 13).
# Call 16 (4 GPUs): the optimizer update under the next forward (--optimizer.overlap_forward),
# 8B FSDP4 selective AC, bf16 and Float8 (tensorwise + float8 all-gather + precomputed scales):
# the reference, ours without and ours with it, in one call. Then the GPU test of the overlap
# (plain and overlapped curves, 1 GPU and FSDP2 float8 concurrently), and rowwise Float8 with
# selective AC under a policy patched to the reference's op set (aten.mm and aten.max only), in
# a copy of the tree.
source scripts/bench/lib.sh
card
S=$ROW_8K
OV="--optimizer.overlap_forward"
T=150 fits 100 ref fsdp4_bf16 0,1,2,3 $S
T=150 fits 100 ours fsdp4_bf16 0,1,2,3 $S --compile.loss $SAC
T=150 fits 100 ours fsdp4_bf16_ov 0,1,2,3 $S --compile.loss $SAC $OV
T=150 fits 100 ref fsdp4_f8 0,1,2,3 $S $REF_F8_FSDP
T=150 fits 100 ours fsdp4_f8 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP
T=150 fits 100 ours fsdp4_f8_ov 0,1,2,3 $S --compile.loss $SAC $OURS_F8_FSDP $OV
for r in fsdp4_bf16 fsdp4_f8; do windows $r; done
for r in fsdp4_bf16_ov fsdp4_f8_ov; do echo "ours $r"; grep -E "step +(1|10|20|30)/" $out/logs/ours_$r.log | sed 's/^\[rank0\]://' | cut -c1-160; done
gpu_test() {
  CUDA_VISIBLE_DEVICES=$1 PYTHONPATH=$site:$root timeout 150 python3 -m pytest -q -s -p no:cacheprovider \
    tests/gpu/test_overlapped_update_gpu.py -k "$2" > $out/logs/gputest_$2.log 2>&1
  echo "gpu test $2 rc=$?: $(grep -E 'differ|passed|failed|skipped' $out/logs/gputest_$2.log | tail -3 | tr '\n' ' ')"
}
if (( DEADLINE - $(date +%s) > 130 )); then
  gpu_test 0 one_gpu_compiled & a=$!; gpu_test 1,2 fsdp2_float8 & b=$!; wait $a $b
fi
variant=/tmp/variant; rm -rf $variant; cp -r $root $variant
sed -i 's/^_MATMULS = .*/_MATMULS = {aten.mm.default}/; s/^_AMAX = .*/_AMAX = {aten.max.default}/' $variant/torchtitan/parallel/activation_checkpoint.py
sed -i 's/    if ac_mode == "selective" and ac_option == "op":/    if False:/' $variant/torchtitan/parallel/float8.py
grep -nE "^_MATMULS|^_AMAX" $variant/torchtitan/parallel/activation_checkpoint.py
(root=$variant; T=100 fits 60 ours rowwise_refops 0,1,2,3 --training.steps 12 --training.seq_len 8192 --compile.enable --compile.loss $SAC --float8.enable --float8.recipe rowwise)
grep -E "step +[0-9]+/" $out/logs/ours_rowwise_refops.log | sed 's/^\[rank0\]://' | cut -c1-120 | head -14
pack
