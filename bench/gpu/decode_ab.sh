#!/usr/bin/env bash
# Serving-path decode speed of this checkout against a baseline checkout, in one device run:
# the same bench/throughput_bench.py arguments over both trees (this one first, then the
# baseline's code with this one's bench script), each measuring copy bandwidth and matmul rate
# itself, so every figure has its roofline from the same machine and minutes.
# Setup and the first device call are decode.sh's; the second call, carry [".gpuwt"]:
#   cd .gpuwt && bash bench/gpu/decode_ab.sh BASELINE_DIR [throughput_bench args]
# BASELINE_DIR holds the baseline's services/, kvstore/ and proto/ (e.g. `git archive` of it).
# Writes $OUT/after.log, $OUT/before.log and $OUT/fa_cache.tar.
set -uo pipefail
cd "$(dirname "$0")/../.."
base="$1"; shift
source bench/gpu/device_env.sh
out="${OUT:-/tmp}"
# The baseline runs this checkout's bench scripts over its own package code.
mkdir -p "$base/bench" && cp bench/throughput_bench.py bench/serving_steps.py bench/gpu_common.py \
  "$base/bench/"
timeout "${AFTER_TIMEOUT_S:-300}" python3 bench/throughput_bench.py "$@" 2>&1 | tee "$out/after.log"
(cd "$base" && timeout "${BEFORE_TIMEOUT_S:-240}" python3 bench/throughput_bench.py "$@") 2>&1 \
  | tee "$out/before.log"
save_fa_cache
