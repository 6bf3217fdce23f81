#!/usr/bin/env bash
# Run one training job and report its steady-state throughput.
#   NGPU=4 CONFIG_FILE=train_configs/llama3_8b.toml scripts/benchmark.sh LOG [overrides...]
# The full log goes to LOG. The last metrics line covers the steps since the previous log step,
# so with --metrics.log_freq 10 and --training.steps 30 it excludes warm-up and compilation.
set -uo pipefail
log=$1; shift
here=$(cd "$(dirname "$0")/.." && pwd)
echo "=== ${CONFIG_FILE:-train_configs/debug_model.toml} NGPU=${NGPU:-auto} $*"
"$here/run_train.sh" "$@" >"$log" 2>&1
rc=$?
grep -E "built llama3|training [0-9]+ steps" "$log" | sed 's/^\[rank0\]://' | head -2
grep -E " step +[0-9]+ " "$log" | tail -1 | sed 's/^\[rank0\]://'
[ $rc -eq 0 ] || { echo "FAILED rc=$rc"; tail -30 "$log"; }
exit $rc
