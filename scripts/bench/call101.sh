#!/usr/bin/env bash
# Call 101 (one H200): what --compile.tune_kernels costs at the start of a run, with inductor's
# cache cold and warm: 1B Float8 tensorwise AC off (batch 4), tuned with an empty cache, tuned
# again on that cache (a restart on the same machine, or on a shared TORCHINDUCTOR_CACHE_DIR),
# then untuned with an empty cache. Prints the seconds from "training" to step 1 of each.
source scripts/bench/lib.sh
card
export CONFIG_FILE=train_configs/llama3_1b.toml
ACO="--training.steps 30 --training.seq_len 8192 --compile.enable --compile.loss --training.local_batch_size 4 --activation_checkpoint.mode none --float8.enable"
first_step() {
  local log=$out/logs/ours_$1.log t0 t1
  t0=$(grep -m1 "INFO training " $log | sed 's/^\[rank0\]://' | cut -c1-8)
  t1=$(grep -m1 "INFO step  1/" $log | sed 's/^\[rank0\]://' | cut -c1-8)
  echo "$1: training at $t0, step 1 at $t1: $(( $(date -d $t1 +%s) - $(date -d $t0 +%s) )) s"
}
TORCHINDUCTOR_CACHE_DIR=/tmp/ic_tuned T=200 fits 200 ours tuned_cold 0 $ACO --compile.tune_kernels
TORCHINDUCTOR_CACHE_DIR=/tmp/ic_tuned T=110 fits 110 ours tuned_warm 0 $ACO --compile.tune_kernels
TORCHINDUCTOR_CACHE_DIR=/tmp/ic_plain T=110 fits 110 ours plain_cold 0 $ACO
for n in tuned_cold tuned_warm plain_cold; do first_step $n; done
pack
