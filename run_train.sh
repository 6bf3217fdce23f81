#!/usr/bin/env bash
# Launch training with torchrun. Extra arguments are config overrides, e.g.
#   NGPU=4 CONFIG_FILE=train_configs/llama3_8b.toml ./run_train.sh --training.steps 50
# NGPU: processes on this host (default: all visible GPUs, else 1). On a machine without GPUs
#       NGPU > 1 runs that many CPU processes over gloo.
# LOG_RANK: comma-separated ranks whose output is shown (default 0).
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
CONFIG_FILE=${CONFIG_FILE:-train_configs/debug_model.toml}
LOG_RANK=${LOG_RANK:-0}

visible=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")
NGPU=${NGPU:-$(( visible > 0 ? visible : 1 ))}
if ! [[ "$NGPU" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: NGPU must be a positive integer; got '$NGPU'" >&2; exit 2
fi
if (( visible > 0 && NGPU > visible )); then
  echo "error: NGPU=$NGPU but only $visible GPU(s) are visible; set NGPU<=$visible" >&2; exit 2
fi

# Fail on config, tokenizer and dataset mistakes in one line, before torchrun starts N processes.
WORLD_SIZE=$NGPU "$PYTHON" -m torchtitan.preflight --job.config_file "$CONFIG_FILE" "$@"

exec "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$NGPU" \
  --local-ranks-filter "$LOG_RANK" --role rank --tee 3 \
  -m torchtitan.train --job.config_file "$CONFIG_FILE" "$@"
