#!/usr/bin/env bash
# Fault-tolerant training on one host: a torchft lighthouse and REPLICA_GROUPS replica groups,
# each a torchrun job of NGPU_PER_GROUP processes (on GPUs, group i gets GPUs
# i*NGPU_PER_GROUP ... (i+1)*NGPU_PER_GROUP-1), e.g.
#   REPLICA_GROUPS=2 NGPU_PER_GROUP=4 CONFIG_FILE=train_configs/llama3_8b.toml \
#     scripts/fault_tolerant_local.sh --training.steps 100
# Extra arguments are config overrides for every group (docs/fault_tolerance.md). Each group
# trains with --fault_tolerance.replica_id i, writes into its own dump folder
# DUMP_FOLDER/replica_<i> (logs, metrics, checkpoints) and is restarted by torchrun up to
# MAX_RESTARTS times, after which it rejoins with the live groups' weights. Kill one of a
# group's processes (kill -9 PID) to watch the others continue and the group come back.
# Group 0's rank 0 prints to the console; every group's output is in DUMP_FOLDER/replica_<i>.log.
#
# REPLICA_GROUPS  replica groups (default 2)
# NGPU_PER_GROUP  processes per group (default 1; on CPU that many gloo processes)
# MAX_RESTARTS    torchrun restarts of a group (default 3)
# LIGHTHOUSE_PORT port of the lighthouse on this host (default 29510)
# DUMP_FOLDER     parent of the groups' dump folders (default ./outputs/fault_tolerant)
# CONFIG_FILE, PYTHON as for run_train.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
CONFIG_FILE=${CONFIG_FILE:-$ROOT/train_configs/debug_model.toml}
REPLICA_GROUPS=${REPLICA_GROUPS:-2}
NGPU_PER_GROUP=${NGPU_PER_GROUP:-1}
MAX_RESTARTS=${MAX_RESTARTS:-3}
LIGHTHOUSE_PORT=${LIGHTHOUSE_PORT:-29510}
DUMP_FOLDER=${DUMP_FOLDER:-./outputs/fault_tolerant}

for name in REPLICA_GROUPS NGPU_PER_GROUP; do
  if ! [[ "${!name}" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: $name must be a positive integer; got '${!name}'" >&2; exit 2
  fi
done
LIGHTHOUSE=$(dirname "$PYTHON")/torchft_lighthouse
[[ -x "$LIGHTHOUSE" ]] || LIGHTHOUSE=$(command -v torchft_lighthouse || true)
if [[ -z "$LIGHTHOUSE" ]]; then
  echo "error: torchft_lighthouse not found; pip install -e '.[ft]'" >&2; exit 2
fi

mkdir -p "$DUMP_FOLDER"
# The lighthouse lets a quorum form with one live group (the others may be down); a replica
# that stops heartbeating for 5 s is dropped from the next quorum.
"$LIGHTHOUSE" --min_replicas 1 --bind "[::]:$LIGHTHOUSE_PORT" --join_timeout_ms 10000 \
  >"$DUMP_FOLDER.lighthouse.log" 2>&1 &
lighthouse_pid=$!
pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  kill "$lighthouse_pid" 2>/dev/null || true
}
trap stop_all EXIT
for _ in $(seq 50); do  # up to 5 s for it to listen
  (exec 3<>"/dev/tcp/localhost/$LIGHTHOUSE_PORT") 2>/dev/null && break
  sleep 0.1
done

FT=(--fault_tolerance.enable --fault_tolerance.group_size "$REPLICA_GROUPS"
  --fault_tolerance.lighthouse "http://localhost:$LIGHTHOUSE_PORT")
WORLD_SIZE=$NGPU_PER_GROUP "$PYTHON" -m torchtitan.preflight --job.config_file "$CONFIG_FILE" \
  "$@" "${FT[@]}" --job.dump_folder "$DUMP_FOLDER/replica_0"

visible=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")
for ((i = 0; i < REPLICA_GROUPS; i++)); do
  devices=""
  if (( visible > 0 )); then
    devices=$(seq -s, $((i * NGPU_PER_GROUP)) $(((i + 1) * NGPU_PER_GROUP - 1)))
  fi
  log="$DUMP_FOLDER/replica_$i.log"
  CUDA_VISIBLE_DEVICES=${devices:-${CUDA_VISIBLE_DEVICES:-}} "$PYTHON" -m torchtitan.launch \
    --standalone --max-restarts "$MAX_RESTARTS" --nproc_per_node "$NGPU_PER_GROUP" \
    --local-ranks-filter 0 --role rank --tee 3 \
    -m torchtitan.train --job.config_file "$CONFIG_FILE" "$@" "${FT[@]}" \
    --fault_tolerance.replica_id "$i" --job.dump_folder "$DUMP_FOLDER/replica_$i" >"$log" 2>&1 &
  pids+=($!)
done
tail -n +1 -F "$DUMP_FOLDER/replica_0.log" 2>/dev/null &
pids+=($!)

status=0
for ((i = 0; i < REPLICA_GROUPS; i++)); do
  if ! wait "${pids[$i]}"; then
    status=1
    echo "replica group $i failed: see $DUMP_FOLDER/replica_$i.log" >&2
  fi
done
exit $status
