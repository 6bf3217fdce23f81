#!/usr/bin/env bash
# Call 52 (2 GPUs): (1) what the in-place loss buys end to end: 1B AC off batch 4, ours with
# --training.logits_loss standard (the compiled F.cross_entropy, as before) beside ours with the
# default (in place), then with the GPUs swapped. (2) 1B AC off with --compile.tune_kernels
# against the reference, swapped likewise. nvidia-smi logs each GPU's SM clock and power draw
# every 200 ms during each pair (read only).
# As it ran, this script hangs after its first pair: `wait` also waits for the nvidia-smi logger
# (started in the background before the pair), which never exits. call53.sh ran the rest.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --training.local_batch_size 4 --activation_checkpoint.mode none"
smi_start() { nvidia-smi --query-gpu=index,clocks.sm,power.draw --format=csv,noheader,nounits -lms 200 > $out/logs/smi_$1.log & SMI=$!; }
smi_stop() { kill $SMI; awk -F', ' '{n[$1]++; c[$1]+=$2; p[$1]+=$3} END {for (g in n) printf "  GPU %s: mean SM clock %.0f MHz, power %.0f W (%d samples)\n", g, c[g]/n[g], p[g]/n[g], n[g]}' $out/logs/smi_$1.log; }
smi_start ab_a
T=120 fits 120 ours std_a 0 $ACO --compile.loss --training.logits_loss standard &
T=120 fits 120 ours inp_a 1 $ACO --compile.loss & wait; smi_stop ab_a
smi_start ab_b
T=120 fits 120 ours std_b 1 $ACO --compile.loss --training.logits_loss standard &
T=120 fits 120 ours inp_b 0 $ACO --compile.loss & wait; smi_stop ab_b
for r in std_a inp_a std_b inp_b; do echo "ours $r"; grep -E "INFO step +(10|20|30)/" $out/logs/ours_$r.log | cut -c1-160; done
smi_start tuned_a
T=170 fits 170 ours 1b_tuned_a 0 $ACO --compile.loss --compile.tune_kernels &
T=170 fits 170 ref 1b_tuned_a 1 $ACO --model.flavor 1B & wait; smi_stop tuned_a
smi_start tuned_b
T=170 fits 170 ours 1b_tuned_b 1 $ACO --compile.loss --compile.tune_kernels &
T=170 fits 170 ref 1b_tuned_b 0 $ACO --model.flavor 1B & wait; smi_stop tuned_b
windows 1b_tuned_a; windows 1b_tuned_b
pack
