#!/usr/bin/env bash
# Serving-path decode speed on the H200 in two device calls made back to back: EngineCore with
# decode graphs off (the eager baseline) and on, the nano-vllm-shaped throughput case, launches
# per step from torch.profiler and the copy-bandwidth / matmul ceilings, all in one run; then
# the 8b model section of gpu_engine_bench.py (prefill MFU, cached TTFT) while time is left.
# The device copies the lead's checkout, so this worktree travels as an ignored folder of it:
#   here:   ../shared/gpu/prepare-flash-attn.sh .gpu   (once), the grpc/protobuf wheels in .whl
#           (serving.sh says how), then copy the worktree to <checkout>/.gpuwt and part1 to
#           <checkout>/.gpufa/ (both listed in .git/info/exclude)
#   call 1, carry [".gpufa/part1.tar.xz"]:  mkdir -p /tmp/fa && tar -C /tmp/fa -xJf .gpufa/part1.tar.xz
#   call 2, carry [".gpuwt"]:               cd .gpuwt && bash bench/gpu/decode.sh [bench args]
# Call 2 writes $OUT/throughput.log, $OUT/model.log and $OUT/fa_cache.tar (flash-attn's compiled
# kernels: put it in .gpuwt/.gpu/ for the next run to skip the JIT).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out="${OUT:-/tmp}"
start=$(date +%s)
timeout "${THROUGHPUT_TIMEOUT_S:-420}" python3 bench/throughput_bench.py "$@" 2>&1 | tee "$out/throughput.log"
left=$(( ${TOTAL_S:-540} - ($(date +%s) - start) ))
if [ "$left" -gt 60 ]; then
  timeout "$left" python3 bench/gpu_engine_bench.py --only "model 8b" --models 8b 2>&1 | tee "$out/model.log"
fi
save_fa_cache
