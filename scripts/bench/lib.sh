# Side-by-side helpers for a GPU machine (run from the repo root; needs .peer/ from ../shared/peer/build.sh).
# ref NAME GPUS ARGS / ours NAME GPUS ARGS run one side on the listed GPUs (1-GPU runs can go concurrently);
# each prints the last metrics line (step 30 or 20); logs go to $OUT/logs, packed by `pack`.
# PREPEND_PATH=DIR puts DIR first on both sides' PYTHONPATH (e.g. scripts/bench/step_timing).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTORCH_ALLOC_CONF="expandable_segments:True"
root=$PWD; peer=$root/.peer; site=/tmp/peer_site; out=${OUT:-/tmp}; mkdir -p $out/logs
if [ ! -f $site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $site $peer/whl/*.whl && touch $site/.done
fi
ngpus() { awk -F, '{print NF}' <<<"$1"; }
# ref NAME GPUS ARGS...: the reference framework (bench_8b.toml + args)
ref() {
  local name=$1 gpus=$2; shift 2
  (cd $peer/torchtitan && CUDA_VISIBLE_DEVICES=$gpus PYTHONPATH=${PREPEND_PATH:+$PREPEND_PATH:}$site:$peer/torchtitan timeout ${T:-300} \
    torchrun --nproc_per_node=$(ngpus $gpus) --rdzv_backend c10d --rdzv_endpoint=localhost:0 \
    --local-ranks-filter 0 --role rank --tee 3 -m torchtitan.train --job.config_file bench_8b.toml \
    --training.dataset c4_test --model.hf_assets_path tests/assets/tokenizer --metrics.log_freq 10 \
    --job.dump_folder /tmp/ref_$name "$@" > $out/logs/ref_$name.log 2>&1)
  echo "ref  $name rc=$? :: $(grep -E 'step:' $out/logs/ref_$name.log | sed 's/\x1b\[[0-9;]*m//g' | grep -E 'step: *30 |step: *20 ' | tail -1 | sed 's/.*step:/step:/')"
}
# ours NAME GPUS ARGS...: this project (CONFIG_FILE, default the 8B config)
ours() {
  local name=$1 gpus=$2; shift 2
  (cd $root && CUDA_VISIBLE_DEVICES=$gpus PYTHONPATH=${PREPEND_PATH:+$PREPEND_PATH:}$site:$root PYTHON=python3 NGPU=$(ngpus $gpus) \
    CONFIG_FILE=${CONFIG_FILE:-train_configs/llama3_8b.toml} timeout ${T:-300} ./run_train.sh \
    --metrics.log_freq 10 --training.dataset sample --metrics.enable_tensorboard false \
    --job.dump_folder /tmp/ours_$name "$@" > $out/logs/ours_$name.log 2>&1)
  echo "ours $name rc=$? :: $(grep -E 'INFO step +(20|30)/' $out/logs/ours_$name.log | sed 's/^\[rank0\]://' | tail -1)"
}
pack() { (cd $out && tar czf logs.tgz logs && rm -rf logs); }
# pair "A_CMD" "B_CMD": two commands side by side (one GPU each), each only if T seconds (default
# 150) are left before the deadline, and stopped after them.
pair() {
  local t=${T:-150}
  T=$t fits $t $1 &
  local p=$!
  T=$t fits $t $2 &
  wait $p $!
}
# block_step NAME GPU IMPL ARGS...: scripts/bench/block_step.py (IMPL ours or ref) on one GPU,
# stopped after T seconds (default 150); prints its timing line and the SHOW (default 8) after it.
block_step() {
  local name=$1 gpu=$2 impl=$3 path=$root; shift 3
  [ $impl = ref ] && path=$peer/torchtitan
  CUDA_VISIBLE_DEVICES=$gpu TORCHINDUCTOR_CACHE_DIR=/tmp/ic_$name PYTHONPATH=$site:$path timeout ${T:-150} \
    python3 $root/scripts/bench/block_step.py --impl $impl "$@" > $out/logs/blk_$name.log 2>&1
  echo "== $name rc=$?"
  grep -A${SHOW:-8} "forward+backward" $out/logs/blk_$name.log | grep -v -i warn | cut -c1-160
}
# speed NAME ARGS...: scripts/bench/generate_speed.py on GPU 0, stopped after T seconds (default
# 200); prints its timing lines.
speed() {
  local name=$1; shift
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$site:$root timeout ${T:-200} python3 $root/scripts/bench/generate_speed.py "$@" \
    > $out/logs/speed_$name.log 2>&1
  echo "== $name rc=$?"
  grep -E "H200|first token|profiled|Error" $out/logs/speed_$name.log | cut -c1-200
}
# gpu_test NAME GPUS FILE: pytest FILE (tests/gpu/) on the listed GPUs, output to $out/logs/NAME.log.
gpu_test() {
  CUDA_VISIBLE_DEVICES=$2 PYTHONPATH=$site:$root timeout ${T:-300} python3 -m pytest -q -s -p no:cacheprovider \
    $3 > $out/logs/$1.log 2>&1
  echo "$1 rc=$?"
}
DEADLINE=$(( $(date +%s) + ${BUDGET:-560} ))
# fits SECONDS CMD...: run CMD only if SECONDS are left before the call's deadline (so pack still runs).
fits() { local need=$1; shift; if (( DEADLINE - $(date +%s) > need )); then "$@"; else echo "skipped (no time): $*"; fi; }

# Flags the call scripts share (calls 1-3 spell most of them out as they ran).
# The benchmark rows' common settings: seq 8192, 30 steps, compile (the 8B and 1B rows); 8B CP4 at
# seq 32768, 20 steps; 8B PP2 (Interleaved1F1B, 8 microbatches of 1) x FSDP2, 20 steps.
ROW_8K="--training.steps 30 --training.seq_len 8192 --compile.enable"
CP4_ROW="--training.steps 20 --training.seq_len 32768 --compile.enable --parallelism.context_parallel_degree 4"
PP2_ROW="--training.steps 20 --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule Interleaved1F1B --training.local_batch_size 8 --parallelism.pipeline_parallel_microbatch_size 1 --training.seq_len 8192 --compile.enable"
SAC="--activation_checkpoint.mode selective --activation_checkpoint.save_matmuls alternate"  # ours
REF_F8="--model.converters quantize.linear.float8"
REF_F8_FSDP="$REF_F8 --quantize.linear.float8.enable_fsdp_float8_all_gather --quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp"
OURS_F8_FSDP="--float8.enable --float8.fsdp_float8_all_gather --float8.precompute_scales"
PROFILE_30="--profiling.enable_profiling --profiling.profile_freq 30 --profiling.profiler_warmup 2 --profiling.profiler_active 1"
# The reference writes traces elsewhere by default; this puts them where `traces` looks.
REF_PROFILE_30="$PROFILE_30 --profiling.save_traces_folder profile_traces"
card() { nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1; }
# windows NAME: both sides' metrics lines of steps 10, 20 and 30.
windows() {
  for s in ref ours; do
    echo "$s $1"; grep -E "step:? +(10|20|30)[ /]" $out/logs/${s}_$1.log | grep -v validation \
      | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*\(step\)/\1/' | cut -c1-150
  done
}
# traces NAME STEP TOP: scripts/trace_summary.py on both sides' rank-0 trace of that step.
traces() {
  local f s
  for s in ref ours; do
    f=$(ls /tmp/${s}_$1/profile_traces/iteration_$2/rank0_trace.json 2>/dev/null) && \
      python3 scripts/trace_summary.py $f --top $3 > $out/logs/trace_${s}_$1.txt 2>&1 && cut -c1-150 $out/logs/trace_${s}_$1.txt
  done
}
# memory RUN STEP ARGS...: scripts/memory_summary.py on run RUN's (e.g. ours_1b_mem) rank-0 snapshot.
memory() {
  local run=$1 step=$2 f; shift 2
  f=$(ls /tmp/$run/memory_snapshot/iteration_$step/rank0_memory_snapshot.pickle 2>/dev/null) && \
    python3 scripts/memory_summary.py $f "$@" > $out/logs/mem_$run.txt 2>&1 && cut -c1-160 $out/logs/mem_$run.txt
}
