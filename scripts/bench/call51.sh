#!/usr/bin/env bash
# Call 51 (2 GPUs): the in-place loss (--training.logits_loss auto = in_place on CUDA, the new
# default). (1) tests/gpu/test_inplace_loss.py on GPU 0 beside the loss microbenchmark
# (scripts/bench/cross_entropy.py) on GPU 1. (2) The 1B rows against the reference, one GPU
# each, concurrently, twice with the GPUs swapped (call 50's traces showed the same kernels
# running up to 8% apart on the two GPUs of one host): AC off batch 4, selective AC batch 2,
# Float8 tensorwise AC off batch 4.
source scripts/bench/lib.sh
card
gpu_test inplace_loss 0 tests/gpu/test_inplace_loss.py &
(CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$site:$root python3 scripts/bench/cross_entropy.py > $out/logs/ce_bench.log 2>&1) &
wait
tail -5 $out/logs/inplace_loss.log; cat $out/logs/ce_bench.log
grep -q " passed" $out/logs/inplace_loss.log || { tail -40 $out/logs/inplace_loss.log; pack; exit 1; }
export CONFIG_FILE=train_configs/llama3_1b.toml
B="--training.steps 30 --training.seq_len 8192 --compile.enable"
ACO="$B --training.local_batch_size 4 --activation_checkpoint.mode none"
SAC2="$B --training.local_batch_size 2"
swapped() {  # swapped NAME SECONDS OURS_ARGS -- REF_ARGS: ours on GPU 0 / ref on 1, then swapped
  local name=$1 t=$2; shift 2; local o=() r=(); while [ "$1" != "--" ]; do o+=("$1"); shift; done; shift; r=("$@")
  T=$t fits $t ours ${name}_a 0 "${o[@]}" & T=$t fits $t ref ${name}_a 1 "${r[@]}" & wait
  T=$t fits $t ours ${name}_b 1 "${o[@]}" & T=$t fits $t ref ${name}_b 0 "${r[@]}" & wait
  windows ${name}_a; windows ${name}_b
}
swapped 1b_aco 120 $ACO --compile.loss -- $ACO --model.flavor 1B
swapped 1b_sac 110 $SAC2 --compile.loss $SAC -- $SAC2 --model.flavor 1B
swapped 1b_f8 120 $ACO --compile.loss --float8.enable -- $ACO --model.flavor 1B $REF_F8
pack
