#!/usr/bin/env bash
# Call 19 (4 GPUs). (1) 8B FSDP2xTP2 Float8: the scalar amax all-reduces of the sharded casts
# (finding 14) against --float8.tp_shard_scales, which scales each TP shard on its own; both
# profiled at step 30 (compare steps 11-20), the reference between them. (When this ran, false was
# the default and the first run passed no flag; it became the default after this call.) (2) Rowwise Float8 +
# selective AC at 8B with local batch 2 (the 8B runs that diverged had batch 1): the refusal is
# lifted in a copy of the tree; 6 steps, the grad norm of step 1 is the answer.
source scripts/bench/lib.sh
card
S=$ROW_8K
TP2="--parallelism.tensor_parallel_degree 2"
T=170 fits 420 ours fsdp2tp2_f8 0,1,2,3 $S $TP2 --compile.loss $SAC $OURS_F8_FSDP --float8.tp_shard_scales false $PROFILE_30
T=170 fits 300 ref fsdp2tp2_f8 0,1,2,3 $S $TP2 $REF_F8_FSDP
T=170 fits 170 ours fsdp2tp2_f8_shard 0,1,2,3 $S $TP2 --compile.loss $SAC $OURS_F8_FSDP --float8.tp_shard_scales $PROFILE_30
for r in fsdp2tp2_f8 fsdp2tp2_f8_shard; do echo "ours $r"; grep -E "step +(10|20|30)/" $out/logs/ours_$r.log | sed 's/^\[rank0\]://' | cut -c1-150; done
windows fsdp2tp2_f8
for r in fsdp2tp2_f8 fsdp2tp2_f8_shard; do
  f=$(ls /tmp/ours_$r/profile_traces/iteration_30/rank0_trace.json 2>/dev/null) && \
    python3 scripts/trace_summary.py $f --top 14 > $out/logs/trace_ours_$r.txt 2>&1 && cut -c1-150 $out/logs/trace_ours_$r.txt
done
variant=/tmp/variant; rm -rf $variant; cp -r $root $variant
sed -i 's/    if ac_mode == "selective" and ac_option == "op":/    if False:/' $variant/torchtitan/parallel/float8.py
RW="--training.steps 6 --training.seq_len 8192 --compile.enable --compile.loss $SAC --float8.enable --float8.recipe rowwise --metrics.log_freq 1"
(root=$variant; T=110 fits 115 ours rowwise_b2 0,1,2,3 $RW --training.local_batch_size 2)
grep -E "step +[0-9]+/" $out/logs/ours_rowwise_b2.log | sed 's/^\[rank0\]://' | cut -c1-110 | head -6
pack
