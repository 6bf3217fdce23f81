#!/usr/bin/env bash
# Launch training with torchrun. Extra arguments are config overrides, e.g.
#   NGPU=4 CONFIG_FILE=train_configs/llama3_8b.toml ./run_train.sh --training.steps 50
# Relative paths (CONFIG_FILE, and in the config: dataset, tokenizer, dump folder, checkpoints)
# are relative to the directory you run this from; CONFIG_FILE defaults to the bundled
# train_configs/debug_model.toml. --help lists every option with the value the config sets.
# A failure ends with one line that says why (the ranks' full logs are in
# <dump_folder>/logs/); the first Ctrl-C saves a checkpoint and stops, a second stops at once.
# NGPU: processes on this host (default: all visible GPUs, else 1). On a machine without GPUs
#       NGPU > 1 runs that many CPU processes over gloo.
# LOG_RANK: comma-separated local ranks whose output is shown (default 0; on every node).
#
# Multi-node: run this script once on every node with the same NGPU, CONFIG_FILE and arguments
# (see docs/multinode.md and scripts/slurm_multinode.sbatch), e.g. on node 0 and node 1 of two:
#   NNODES=2 NODE_RANK=0 RDZV_ENDPOINT=node0:29500 ./run_train.sh ...
#   NNODES=2 NODE_RANK=1 RDZV_ENDPOINT=node0:29500 ./run_train.sh ...
# NNODES: number of nodes (default 1: a single-node --standalone launch).
# NODE_RANK: this node's index, 0 <= NODE_RANK < NNODES (default 0).
# RDZV_ENDPOINT: host:port of the c10d rendezvous store, the same on every node; required when
#       NNODES > 1. The node whose address it names hosts the store (usually node 0).
# RDZV_ID: rendezvous id shared by the nodes of one job (default "torchtitan").
# The world size is NNODES * NGPU; the parallel degrees must multiply to it.
set -euo pipefail
# No cd: a relative path must mean what it means where the user typed it. PYTHONPATH finds this
# checkout's torchtitan from anywhere.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
CONFIG_FILE=${CONFIG_FILE:-$ROOT/train_configs/debug_model.toml}

for arg in "$@"; do  # help once, with the config's values, and no job
  if [[ "$arg" == "-h" || "$arg" == "--help" ]]; then
    exec "$PYTHON" -m torchtitan.preflight --job.config_file "$CONFIG_FILE" "$@"
  fi
done
LOG_RANK=${LOG_RANK:-0}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
RDZV_ID=${RDZV_ID:-torchtitan}

visible=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")
NGPU=${NGPU:-$(( visible > 0 ? visible : 1 ))}
if ! [[ "$NGPU" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: NGPU must be a positive integer; got '$NGPU'" >&2; exit 2
fi
if (( visible > 0 && NGPU > visible )); then
  echo "error: NGPU=$NGPU but only $visible GPU(s) are visible; set NGPU<=$visible" >&2; exit 2
fi
if ! [[ "$NNODES" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: NNODES must be a positive integer; got '$NNODES'" >&2; exit 2
fi
if ! [[ "$NODE_RANK" =~ ^(0|[1-9][0-9]*)$ ]] || (( NODE_RANK >= NNODES )); then
  echo "error: NODE_RANK must be an integer in [0, NNODES=$NNODES); got '$NODE_RANK'" >&2; exit 2
fi

if (( NNODES > 1 )); then
  if ! [[ "${RDZV_ENDPOINT:-}" =~ ^[^[:space:]]+:[0-9]+$ ]]; then
    echo "error: NNODES=$NNODES needs RDZV_ENDPOINT=host:port (the same on every node, e.g." \
      "node 0's address and a free port); got '${RDZV_ENDPOINT:-}'" >&2; exit 2
  fi
  launcher=(--nnodes="$NNODES" --node_rank="$NODE_RANK" --rdzv_backend=c10d
    --rdzv_endpoint="$RDZV_ENDPOINT" --rdzv_id="$RDZV_ID")
else
  launcher=(--standalone)
fi

# Fail on config, tokenizer and dataset mistakes in one line, before torchrun starts N processes.
WORLD_SIZE=$(( NNODES * NGPU )) "$PYTHON" -m torchtitan.preflight \
  --job.config_file "$CONFIG_FILE" "$@"

# torchrun, ending in the one line that explains a failure (see torchtitan/launch.py).
exec "$PYTHON" -m torchtitan.launch "${launcher[@]}" --nproc_per_node="$NGPU" \
  --local-ranks-filter "$LOG_RANK" --role rank --tee 3 \
  -m torchtitan.train --job.config_file "$CONFIG_FILE" "$@"
