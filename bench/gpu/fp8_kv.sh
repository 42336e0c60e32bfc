#!/usr/bin/env bash
# FP8 vs bf16 KV on the H200 (bench/gpu/fp8_kv_bench.py): decode tok/s of the 8b shape at
# batch 64 (flash backend, eager and CUDA graph, contexts 2048 and 8192) and greedy agreement
# of an fp8 cache with a bf16 one over 300 tokens, in two device calls made back to back
# (flash-attn travels as two archives, each under the 64 MiB a call may carry; see
# ../shared/gpu/README.md). Beforehand, here: ../shared/gpu/prepare-flash-attn.sh .gpu
#
#   call 1, carry [".gpu/part1.tar.xz"]:                         bash bench/gpu/fp8_kv.sh unpack
#   call 2, carry [".gpu/part2.tar.xz"] (and ".gpu/fa_cache.tar" if an earlier call 2 left one
#           in $OUT: flash-attn's compiled kernels, minutes of JIT saved):
#                                                                bash bench/gpu/fp8_kv.sh bench
#
# Call 2 writes $OUT/fp8_kv.log, $OUT/fp8.json and $OUT/fa_cache.tar; extra args go to the
# python bench (--ctx 2048 alone if time is short; --model-path DIR for a real checkpoint).
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  unpack)
    mkdir -p /tmp/fa && tar -C /tmp/fa -xJf .gpu/part1.tar.xz && echo "part1 unpacked"
    ;;
  bench)
    shift
    source bench/gpu/device_env.sh
    timeout "${BENCH_TIMEOUT_S:-520}" python3 bench/gpu/fp8_kv_bench.py "$@" 2>&1 \
      | tee "${OUT:-/tmp}/fp8_kv.log"
    rc=${PIPESTATUS[0]}
    save_fa_cache
    exit "$rc"
    ;;
  *)
    echo "usage: $0 unpack|bench [bench args]"; exit 2
    ;;
esac
