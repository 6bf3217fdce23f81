#!/usr/bin/env bash
# Call 19 (4 GPUs; prepared, not run yet). (1) Rowwise Float8 + selective AC at 8B: does local
# batch 2 train (the 1B runs that trained used batch 2; the 8B ones that diverged, batch 1)? The
# refusal is lifted in a copy of the tree; 6 steps each, grad norm of step 1 is the answer (4.8
# for tensorwise, 1.3e5 when it diverges). (2) The FSDP2xTP2 Float8 TP-style A/B again, in the
# opposite order (plain first), with the reference between them, each profiled at step 30
# (scripts/trace_summary.py: exposed communication, amax all-reduces). (3) PP2xFSDP2 side by side.
source scripts/bench/lib.sh
card
variant=/tmp/variant; rm -rf $variant; cp -r $root $variant
sed -i 's/    if ac_mode == "selective" and ac_option == "op":/    if False:/' $variant/torchtitan/parallel/float8.py
RW="--training.steps 6 --training.seq_len 8192 --compile.enable --compile.loss $SAC --float8.enable --float8.recipe rowwise --metrics.log_freq 1"
(root=$variant; T=100 fits 500 ours rowwise_b2 0,1,2,3 $RW --training.local_batch_size 2)
grep -E "step +[0-9]+/" $out/logs/ours_rowwise_b2.log | sed 's/^\[rank0\]://' | cut -c1-110 | head -6
S="--training.steps 30 --training.seq_len 8192 --compile.enable"
TP2="--parallelism.tensor_parallel_degree 2"
T=170 fits 420 ours fsdp2tp2_f8_plain_tp 0,1,2,3 $S $TP2 --compile.loss $SAC $OURS_F8_FSDP $PROFILE_30
T=170 fits 350 ref fsdp2tp2_f8 0,1,2,3 $S $TP2 $REF_F8_FSDP $REF_PROFILE_30
T=170 fits 280 ours fsdp2tp2_f8 0,1,2,3 $S $TP2 --compile.loss $SAC $OURS_F8_FSDP --float8.tp_float8_all_gather true $PROFILE_30
windows fsdp2tp2_f8
grep -E "step +(10|20|30)/" $out/logs/ours_fsdp2tp2_f8_plain_tp.log | sed 's/^\[rank0\]://' | cut -c1-150
traces fsdp2tp2_f8 30 12
f=$(ls /tmp/ours_fsdp2tp2_f8_plain_tp/profile_traces/iteration_30/rank0_trace.json 2>/dev/null) && python3 scripts/trace_summary.py $f --top 12 | cut -c1-150
PP="--training.steps 20 --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule Interleaved1F1B --training.local_batch_size 8 --parallelism.pipeline_parallel_microbatch_size 1 --training.seq_len 8192 --compile.enable"
T=170 fits 200 ref pp2 0,1,2,3 $PP
T=170 fits 100 ours pp2 0,1,2,3 $PP --compile.loss $SAC
windows pp2
pack
