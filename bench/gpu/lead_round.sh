#!/usr/bin/env bash
# One device call for the model checks that go beside the decode bench: the hybrid-8b model
# through EngineCore (hybrid_bench.py) and greedy parity with transformers with the attention
# kernel chosen on both sides (hf_parity.py: SDPA vs ours, then eager vs our reference), so a
# kernel choice can be told from numerics. Setup and call 1 are decode.sh's; call 2,
# carry [".gpuwt"]:   cd .gpuwt && bash bench/gpu/lead_round.sh
# Writes $OUT/hybrid.log, $OUT/parity.log and $OUT/fa_cache.tar.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out="${OUT:-/tmp}"
timeout "${HYBRID_TIMEOUT_S:-240}" python3 bench/gpu/hybrid_bench.py ${HYBRID_ARGS:-} 2>&1 \
  | tee "$out/hybrid.log"
for pair in "sdpa sdpa" "sdpa flash" "eager reference"; do
  set -- $pair
  timeout "${PARITY_TIMEOUT_S:-100}" python3 bench/gpu/hf_parity.py --models qwen3-1.7b,llama-3.2-1b \
    --prompt-lens 32,512 --hf-attention "$1" --backend "$2" 2>&1 | tee -a "$out/parity.log"
done
save_fa_cache
