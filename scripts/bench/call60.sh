#!/usr/bin/env bash
# Call 60 (1 GPU): where one compiled 1B block's time goes, by kernel category
# (scripts/bench/block_step.py), ours and the reference's, Float8 and bf16, both with the bf16
# residual stream of the FSDP layouts; two inductor switches on our Float8 block; our Float8
# block's generated code comes back for reading.
source scripts/bench/lib.sh
card
blk() { block_step $1 0 ours --top 40 "${@:2}"; }  # blk NAME ARGS...: our block on GPU 0
blkref() { block_step $1 0 ref --top 40 "${@:2}"; }  # blkref NAME ARGS...: the reference's
fits 90 blk f8 --float8
(cd /tmp/ic_f8 && find . -name '*.py' | tar czf $out/f8_code.tgz -T -)
fits 90 blkref ref_f8 --float8
(cd /tmp/ic_ref_f8 && find . -name '*.py' | tar czf $out/ref_f8_code.tgz -T -)
fits 90 blk bf --top 30
fits 90 blkref ref_bf --top 30
TORCHINDUCTOR_COMBO_KERNELS=1 fits 90 blk f8_combo --float8
TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 fits 120 blk f8_cdt --float8
fits 90 blk f8_again --float8 --top 5
pack
