#!/usr/bin/env bash
# Check that parallel layouts reproduce the single-device loss curve: write one seed checkpoint,
# train the same job from it on one device and under each layout, and compare the curves.
#
#   CONFIG_FILE=train_configs/debug_model.toml scripts/layout_parity.sh OUT \
#     "fsdp8:8:--training.local_batch_size 1" \
#     "pp2_fsdp2_tp2:8:--parallelism.pipeline_parallel_degree 2 --parallelism.tensor_parallel_degree 2 --training.local_batch_size 4" \
#     -- --training.steps 50 --training.global_batch_size 8
#
# Each layout is NAME:NPROC:OVERRIDES. Arguments after "--" go to every run (keep the global batch
# fixed there so that all runs see the same samples). OUT must not exist; runs go to OUT/<name>,
# logs to OUT/<name>.log. On GPUs compare within bf16 noise; on CPU (fp32) within ~1e-5.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$here/.venv/bin/python" ] && echo "$here/.venv/bin/python" || echo python3)}
export PYTHON
CONFIG_FILE=${CONFIG_FILE:-$here/train_configs/debug_model.toml}
export CONFIG_FILE

usage() { echo "usage: $0 OUT NAME:NPROC:OVERRIDES [...] [-- COMMON_OVERRIDES]" >&2; exit 2; }
(( $# >= 2 )) || usage
out=$1; shift
[[ -e "$out" ]] && { echo "error: $out exists; pick a new folder (nothing is overwritten)" >&2; exit 2; }

layouts=()
while (( $# )) && [[ "$1" != "--" ]]; do
  [[ "$1" =~ ^[A-Za-z0-9_.-]+:[1-9][0-9]*:.*$ ]] \
    || { echo "error: layout '$1' is not NAME:NPROC:OVERRIDES (e.g. fsdp2:2:--training.local_batch_size 4)" >&2; exit 2; }
  layouts+=("$1"); shift
done
(( $# )) && shift  # the "--"
common=("$@")
(( ${#layouts[@]} )) || usage

mkdir -p "$out"
out=$(cd "$out" && pwd)
seed="$out/seed/checkpoint/step-0"
run_layout() {  # name nproc [overrides...]
  local name=$1 nproc=$2; shift 2
  echo "== $name ($nproc processes)"
  NGPU=$nproc "$here/run_train.sh" "${common[@]}" "$@" --metrics.log_freq 1 \
    --checkpoint.initial_load_path "$seed" --job.dump_folder "$out/$name" >"$out/$name.log" 2>&1 \
    || { echo "error: $name failed; see $out/$name.log" >&2; tail -5 "$out/$name.log" >&2; exit 1; }
}

echo "== seed checkpoint"
# Like run_train.sh: relative paths mean the caller's directory; this checkout is imported.
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m torchtitan.train \
  --job.config_file "$CONFIG_FILE" "${common[@]}" \
  --job.dump_folder "$out/seed" --checkpoint.create_seed_checkpoint >"$out/seed.log" 2>&1 \
  || { echo "error: the seed checkpoint failed; see $out/seed.log" >&2; exit 1; }
run_layout reference 1
names=()
for layout in "${layouts[@]}"; do
  IFS=: read -r name nproc overrides <<<"$layout"
  read -r -a extra <<<"$overrides"
  run_layout "$name" "$nproc" "${extra[@]}"
  names+=("$out/$name")
done
"$PYTHON" "$here/scripts/compare_loss_curves.py" "$out/reference" "${names[@]}"
