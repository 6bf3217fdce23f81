#!/usr/bin/env bash
# Call 58 (2 GPUs): the layouts without data parallelism run under bf16 autocast, where finding
# 23 now casts the embedding's output to bf16: PP2 (1F1B, the in-place loss on the last stage;
# stage 0 now sends bf16 hidden states) and CP2, 1B, 12 steps each, against the same layouts
# with --training.logits_loss standard for PP2. Losses and memory only: no timing claims.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
B="--training.steps 12 --training.seq_len 8192 --compile.enable --training.local_batch_size 4"
PP="--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule 1F1B --parallelism.pipeline_parallel_microbatch_size 1"
T=130 fits 130 ours pp2 0,1 $B $PP --compile.loss
T=130 fits 130 ours pp2_std 0,1 $B $PP --compile.loss --training.logits_loss standard
T=130 fits 130 ours cp2 0,1 $B --parallelism.context_parallel_degree 2 --compile.loss
for r in pp2 pp2_std cp2; do echo "ours $r"; grep -E "INFO step +(1|10|12)/|Error|error" $out/logs/ours_$r.log | tail -4 | cut -c1-170; done
pack
