#!/usr/bin/env bash
# One device call that re-measures a merged checkout: serving decode (8b batch 64 and 1b batch
# 256 at 2k context, eager step vs planned ahead, each with its roofline from the same run),
# then the hybrid-8b bench. Setup and call 1 are decode.sh's; call 2, carry [".gpuwt"]:
#   cd .gpuwt && bash bench/gpu/final_round.sh
# Writes $OUT/decode.log, $OUT/hybrid.log and $OUT/fa_cache.tar.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out="${OUT:-/tmp}"
timeout "${DECODE_TIMEOUT_S:-330}" python3 bench/throughput_bench.py --models 8b,1b \
  --modes no-ahead,auto --decode 8b:64,1b:256 --page-size 128 --kv-pages 8b:4600,1b:4600 \
  --throughput-models none --agreement-models 8b 2>&1 | tee "$out/decode.log"
timeout "${HYBRID_TIMEOUT_S:-200}" python3 bench/gpu/hybrid_bench.py 2>&1 | tee "$out/hybrid.log"
save_fa_cache
