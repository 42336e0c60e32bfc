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
if [ ! -d /tmp/fa/flash_attn ]; then echo "fresh machine: run call 1 (unpack part1) first"; exit 2; fi
tar -C /tmp/fa -xJf .gpu/part2.tar.xz || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:/tmp/fa:/tmp/fa/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa_cache
if [ -f .gpu/fa_cache.tar ]; then tar -C /tmp -xf .gpu/fa_cache.tar; fi
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
start=$(date +%s)
timeout "${THROUGHPUT_TIMEOUT_S:-420}" python3 bench/throughput_bench.py "$@" 2>&1 | tee "$out/throughput.log"
left=$(( ${TOTAL_S:-540} - ($(date +%s) - start) ))
if [ "$left" -gt 60 ]; then
  timeout "$left" python3 bench/gpu_engine_bench.py --only "model 8b" --models 8b 2>&1 | tee "$out/model.log"
fi
if [ -d /tmp/fa_cache ]; then tar -C /tmp -cf "$out/fa_cache.tar" fa_cache; fi
