#!/usr/bin/env bash
# The engine's GPU benchmark on the H200 device machine, in two device calls made back to back
# (flash-attn travels as two archives, each under the 64 MiB a call may carry; see
# ../shared/gpu/README.md). Beforehand, here: ../shared/gpu/prepare-flash-attn.sh .gpu
#
#   call 1, carry [".gpu/part1.tar.xz"]:        bash bench/gpu/run.sh unpack
#   call 2, carry [".gpu/part2.tar.xz"] (and ".gpu/fa_cache.tar" if an earlier call 2 left one
#           in $OUT: it holds flash-attn's compiled kernels and saves minutes of JIT):
#                                               bash bench/gpu/run.sh bench [extra bench args]
#
# Call 2 writes $OUT/bench.log and $OUT/fa_cache.tar. `hybrid` in place of `bench` runs
# bench/gpu/hybrid_bench.py (the hybrid-8b model through EngineCore) the same way.
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  unpack)
    mkdir -p /tmp/fa && tar -C /tmp/fa -xJf .gpu/part1.tar.xz && echo "part1 unpacked"
    ;;
  bench|hybrid)
    script=bench/gpu_engine_bench.py
    if [ "$1" = hybrid ]; then script=bench/gpu/hybrid_bench.py; fi
    shift
    source bench/gpu/device_env.sh
    if [ "$script" = bench/gpu_engine_bench.py ]; then set -- --budget-s "${BENCH_BUDGET_S:-420}" "$@"; fi
    timeout "${BENCH_TIMEOUT_S:-520}" python3 "$script" "$@" 2>&1 \
      | tee "${OUT:-/tmp}/bench.log"
    rc=${PIPESTATUS[0]}
    save_fa_cache
    exit "$rc"
    ;;
  *)
    echo "usage: $0 unpack|bench|hybrid [bench args]"; exit 2
    ;;
esac
