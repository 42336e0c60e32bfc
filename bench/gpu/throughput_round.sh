#!/usr/bin/env bash
# One device call for the throughput shape nano-vllm and mini-sglang publish (256 sequences,
# in/out uniform 100-1024, no stop tokens) on the Qwen3-0.6B and 8b shapes, eager host step vs
# planned ahead (the shipped default). Setup and call 1 are decode.sh's; call 2, carry
# [".gpuwt"]:   cd .gpuwt && bash bench/gpu/throughput_round.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
timeout "${THROUGHPUT_TIMEOUT_S:-260}" python3 bench/throughput_bench.py --models qwen3-0.6b,8b \
  --modes no-ahead,auto --throughput-models qwen3-0.6b,8b --throughput-modes no-ahead,auto \
  --decode qwen3-0.6b:256,8b:64 --page-size 128 --kv-pages qwen3-0.6b:9000,8b:4600 \
  --agreement-models none --budget-s 200 \
  2>&1 | tee "${OUT:-/tmp}/throughput.log"
save_fa_cache
