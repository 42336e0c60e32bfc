#!/usr/bin/env bash
# One device call (~8 minutes): output tok/s through EngineCore at TensorRT-LLM's ISL/OSL
# pairs (fixed input/output lengths, no stop tokens), the 8b shape, shipped defaults, page 128.
# Setup and call 1 are kernel_round.sh's; call 2, carry [".gpu/part2.tar.xz", ".whl"]:
#   bash bench/gpu/isl_osl_round.sh [pairs, default all four] [requests per pair]
# Pairs run in order; one that would start past the budget is skipped (printed as such).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
pairs="${1:-128/128,1000/1000,128/2048,2048/2048}"
pages=4600  # the 8b shape's pages of 128 tokens on an H200; an 80 GB card takes fewer
gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
if [ "${gib:-0}" -lt 100000 ]; then pages=2800; fi
seqs="${2:-256}"
timeout "${GRID_TIMEOUT_S:-470}" python3 bench/throughput_bench.py --models 8b --modes auto \
  --grid "$pairs" --grid-models 8b --grid-seqs "$seqs" --grid-batch 256 --grid-only \
  --page-size 128 --kv-pages 8b:$pages --throughput-models none --agreement-models none \
  --budget-s "${GRID_BUDGET_S:-330}" 2>&1 | tee "${OUT:-/tmp}/isl_osl.log"
save_fa_cache
