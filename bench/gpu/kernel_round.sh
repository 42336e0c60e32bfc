#!/usr/bin/env bash
# One device call (~6 minutes): decode attention alone (bench/gpu/decode_attn_bench.py:
# flash-attn vs the Triton split-KV kernel over bf16 and fp8 pages, tilings swept), then decode
# through EngineCore for 8b at batch 64 and 1b at batch 256 with the Triton kernel's decode
# (`auto`, shipped) and flash-attn's (`flash`), each step's device time split into matmul,
# attention and other kernels, and the 8b's greedy output planned ahead vs the eager step.
# Beforehand, here: ../shared/gpu/prepare-flash-attn.sh .gpu and the wheels in .whl
# (serving.sh says which; llguidance==1.9.1 too, manylinux_2_31).
#   call 1, carry [".gpu/part1.tar.xz"]:  mkdir -p /tmp/fa && tar -C /tmp/fa -xJf .gpu/part1.tar.xz
#   call 2, carry [".gpu/part2.tar.xz", ".whl"] (and ".gpu/fa_cache.tar" when an earlier call
#           left one in $OUT):            bash bench/gpu/kernel_round.sh [throughput_bench modes]
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out="${OUT:-/tmp}"
modes="${1:-auto,flash}"
timeout "${ATTN_TIMEOUT_S:-150}" python3 bench/gpu/decode_attn_bench.py 2>&1 | tee "$out/attn.log"
gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
pages8b=4600
if [ "${gib:-0}" -lt 100000 ]; then pages8b=2800; fi
timeout "${DECODE_TIMEOUT_S:-330}" python3 bench/throughput_bench.py --models 8b,1b \
  --modes "$modes" --decode 8b:64,1b:256 --page-size 128 --kv-pages 8b:$pages8b,1b:4600 \
  --throughput-models none --agreement-models 8b 2>&1 | tee "$out/decode.log"
save_fa_cache
