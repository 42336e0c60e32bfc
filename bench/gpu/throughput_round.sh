#!/usr/bin/env bash
# One device call: first the host time of a decode step's page tables alone
# (bench/page_table_bench.py, rebuilt vs persistent), then decode through EngineCore vs the
# roofline with each step's page tables rebuilt from whole tables (`rebuild`, the path before)
# vs the persistent device tables (`auto`, shipped): 8b batch 64 and 1b batch 256, page 128,
# 4,600-page pools; then the throughput shape nano-vllm and mini-sglang publish (256
# sequences, in/out uniform 100-1024) on the Qwen3-0.6B shape, both ways, while time is left.
# Setup and call 1 are decode.sh's; call 2, carry [".gpuwt"]:
#   cd .gpuwt && bash bench/gpu/throughput_round.sh
# The TensorRT-LLM ISL/OSL grid is bench/gpu/isl_osl_round.sh (a call of its own).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out="${OUT:-/tmp}"
start=$(date +%s)
timeout 90 python3 bench/page_table_bench.py --device cuda 2>&1 | tee "$out/page_tables.log"
# 4,600 pages of 128 tokens of the 8b shape are 72 GiB, 9,000 of the Qwen3-0.6B shape 123 GiB:
# an 80 GB card (H100) gets 2,800 and 5,000.
gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
pages8b=4600 pagesq=9000
if [ "${gib:-0}" -lt 100000 ]; then pages8b=2800 pagesq=5000; fi
timeout "${DECODE_TIMEOUT_S:-330}" python3 bench/throughput_bench.py --models 8b,1b \
  --modes rebuild,auto --decode 8b:64,1b:256 --page-size 128 --kv-pages 8b:$pages8b,1b:4600 \
  --throughput-models none --agreement-models 8b 2>&1 | tee "$out/decode.log"
left=$(( ${TOTAL_S:-540} - ($(date +%s) - start) ))
if [ "$left" -gt 90 ]; then
  timeout "$left" python3 bench/throughput_bench.py --models qwen3-0.6b --modes rebuild,auto \
    --throughput-models qwen3-0.6b --throughput-modes rebuild,auto --decode qwen3-0.6b:256 \
    --page-size 128 --kv-pages qwen3-0.6b:$pagesq --agreement-models none \
    --budget-s $(( left - 60 )) 2>&1 | tee "$out/throughput.log"
fi
save_fa_cache
