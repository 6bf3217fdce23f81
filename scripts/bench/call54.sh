#!/usr/bin/env bash
# Call 54 (2 GPUs; only 1- and 2-GPU machines were lent). (1) The in-place loss kernels as changed
# after call 51 (column offset, label logit, masked load): the GPU test, whole vocabulary and a
# shard. (2) 1B Float8 AC off batch 4, one GPU each side: traces of step 12 and inductor's
# generated code (the cache folders, gzipped) to compare the norm-backward + float8 fusions.
# (3) The in-place loss under TP's loss parallel on GPUs: 1B TP2, in place against standard.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
T=240 gpu_test inplace_gpu 0 tests/gpu/test_inplace_loss_on_gpu.py
tail -3 $out/logs/inplace_gpu.log
B="--training.steps 12 --training.seq_len 8192 --compile.enable"
ACO="$B --training.local_batch_size 4 --activation_checkpoint.mode none"
P="--profiling.enable_profiling --profiling.profile_freq 12 --profiling.profiler_warmup 2 --profiling.profiler_active 1"
TORCHINDUCTOR_CACHE_DIR=/tmp/ic_ours T=170 fits 170 ours 1b_f8_tr 0 $ACO --compile.loss --float8.enable $P &
p1=$!
TORCHINDUCTOR_CACHE_DIR=/tmp/ic_ref T=170 fits 170 ref 1b_f8_tr 1 $ACO --model.flavor 1B $REF_F8 $P --profiling.save_traces_folder profile_traces &
p2=$!
wait $p1 $p2
traces 1b_f8_tr 12 70
for s in ours ref; do
  (cd /tmp && find ic_$s -name '*.py' | tar czf $out/code_$s.tgz -T -)
  f=/tmp/${s}_1b_f8_tr/profile_traces/iteration_12/rank0_trace.json
  [ -f $f ] && gzip -c $f > $out/${s}_1b_f8_trace.json.gz
done
TP="--training.steps 20 --training.seq_len 8192 --compile.enable --training.local_batch_size 2 --parallelism.tensor_parallel_degree 2"
T=150 fits 150 ours tp2_inplace 0,1 $TP --compile.loss
T=150 fits 150 ours tp2_standard 0,1 $TP --compile.loss --training.logits_loss standard
for r in tp2_inplace tp2_standard; do echo "ours $r"; grep -E "INFO step +(1|10|20)/" $out/logs/ours_$r.log | cut -c1-170; done
ls -la $out
pack
