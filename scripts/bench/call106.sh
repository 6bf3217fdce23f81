#!/usr/bin/env bash
# Call 106 (one H200): why call 105's 8B decode ran at 30 ms/token after an 8,192-token prompt and
# 18 ms/token after 512. scripts/bench/generate_speed.py (ours, 8B, random weights) printing
# the cold run and each repeat: the default attention against flash only, the head on the last
# prompt position against every position, and one profiled run.
source scripts/bench/lib.sh
card
T=150 fits 150 speed short --flavor 8B --prompt-tokens 512 --new-tokens 256 --impl ours --profile
T=120 fits 120 speed short_flash --flavor 8B --prompt-tokens 512 --new-tokens 256 --impl ours --sdpa flash
T=120 fits 120 speed long --flavor 8B --prompt-tokens 8192 --new-tokens 64 --impl ours --profile
T=120 fits 120 speed long_all --flavor 8B --prompt-tokens 8192 --new-tokens 64 --impl ours --all-positions
T=120 fits 120 speed long_flash --flavor 8B --prompt-tokens 8192 --new-tokens 64 --impl ours --sdpa flash
grep -A16 "profiled" $out/logs/speed_short.log $out/logs/speed_long.log | cut -c1-180
pack
