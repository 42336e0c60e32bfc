#!/usr/bin/env bash
# The decode matmul kernel (model/decode_matmul.py) on the device, in three calls made back to
# back (decode.sh's setup: .gpu from ../shared/gpu/prepare-flash-attn.sh, the wheels in .whl,
# this checkout copied to <checkout>/.gpuwt):
#   call 1, carry [".gpu/part1.tar.xz"]: mkdir -p /tmp/fa && tar -C /tmp/fa -xJf .gpu/part1.tar.xz
#   call 2, carry [".gpuwt"]: cd .gpuwt && bash bench/gpu/matmul_round.sh sweep
#       the kernel's tilings swept over the 8b's shapes at 64 rows beside cuBLAS and cuBLASLt;
#       writes $OUT/gemm.log and $OUT/shapes.json (the best tiling of each shape)
#   call 3, carry [".gpuwt"] with shapes.json copied to .gpuwt/bench/gpu/decode_matmul_shapes.json:
#       cd .gpuwt && bash bench/gpu/matmul_round.sh engine
#       8b at batch 64 through EngineCore as shipped (both Triton decode kernels: the matmuls
#       with the gated activation, RoPE + KV write), with neither (cublas), the activation apart,
#       the RoPE write alone, the matmuls alone and cuBLASLt (MODES overrides), in one run, and
#       greedy tokens of cublas and cublaslt against the shipped path; writes $OUT/engine.log.
#       KV_PAGES=2800 on an 80 GB card (the default 4,600 is the H200's)
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out="${OUT:-/tmp}"
case "${1:-}" in
  sweep)
    timeout "${SWEEP_TIMEOUT_S:-520}" python3 bench/gpu/gemm_bench.py --batches 64 --triton \
      --save-shapes "$out/shapes.json" 2>&1 | tee "$out/gemm.log"
    ;;
  engine)
    shapes=bench/gpu/decode_matmul_shapes.json
    timeout "${ENGINE_TIMEOUT_S:-540}" python3 bench/throughput_bench.py --models 8b \
      --modes "${MODES:-auto,cublas,kernels-ungated,rope-store,triton-mm,cublaslt}" --decode 8b:64 --page-size 128 --kv-pages 8b:"${KV_PAGES:-4600}" \
      --throughput-models none --agreement-models none --kernel-agreement "${AGREE:-cublas,cublaslt}" --budget-s "${BUDGET_S:-400}" \
      $( [ -f "$shapes" ] && echo --decode-matmul-shapes "$shapes" ) 2>&1 | tee "$out/engine.log"
    ;;
  *) echo "usage: matmul_round.sh sweep|engine"; exit 2 ;;
esac
save_fa_cache
