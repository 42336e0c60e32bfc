#!/usr/bin/env bash
# The engine's serving path on the H200: EngineCore (scheduler, kvstore, tiers) with the 1b and
# 8b presets and flash-attn, prefix cache vs an empty cache, in two device calls made back to
# back (flash-attn travels as two archives; grpc/protobuf wheels for the engine's imports as a
# third folder, `.whl`, made with the device README's `pip download` line for
#  grpcio==1.85.1 grpcio-tools==1.85.1 protobuf==7.36.2).
#   call 1, carry [".gpu/part1.tar.xz"]:                       bash bench/gpu/serving.sh unpack
#   call 2, carry [".gpu/part2.tar.xz", ".gpu/fa_cache.tar", ".whl"]: bash bench/gpu/serving.sh bench
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  unpack)
    mkdir -p /tmp/fa && tar -C /tmp/fa -xJf .gpu/part1.tar.xz && echo "part1 unpacked"
    ;;
  bench)
    if [ ! -d /tmp/fa/flash_attn ]; then echo "fresh machine: run call 1 (unpack) first"; exit 2; fi
    tar -C /tmp/fa -xJf .gpu/part2.tar.xz || exit 2
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 2
    export PYTHONPATH=/tmp/site:/tmp/fa:/tmp/fa/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
    export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa_cache
    if [ -f .gpu/fa_cache.tar ]; then tar -C /tmp -xf .gpu/fa_cache.tar; fi
    log="${OUT:-/tmp}/serving.log"
    # KV pages per model: 8 conversations x 17.5k tokens need ~2,200 pages of 64 tokens; an
    # 8b page is 8 MiB (1b: 2 MiB), and a fresh core per turn briefly holds two allocations.
    for model_pages in ${MODELS:-1b:6000 8b:2500}; do
      timeout 250 python3 bench/engine_serving_bench.py --device cuda --model "${model_pages%:*}" \
        --conversations 8 --turns 4 --prompt 16000 --grow 500 --max-tokens 64 --batch 8 \
        --batched-tokens 8192 --page-size 64 --kv-pages "${model_pages#*:}" 2>&1 | tee -a "$log"
    done
    ;;
  *) echo "usage: $0 unpack|bench"; exit 2 ;;
esac
