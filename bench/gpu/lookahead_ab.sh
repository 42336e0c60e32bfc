#!/usr/bin/env bash
# One device call, a same-run A/B of the engine's look-ahead rule with requests waiting at the
# rank: the shipped rule (`auto`) against the one before (`ahead-unqueued`: no step planned
# ahead while a request waits, bench/lookahead_before.py). First the 1b shape decoding a queue
# (512 requests on 128 slots, throughput_bench.py's grid), then, in the time left, the fleet
# replay's defaults against the same arm with the rule before (fleet_arms.py `ahead-unqueued`;
# its step logs carry `ahead` and `waiting`). Packed and unpacked as fleet_replay.sh says:
#   call 1, carry [".gpufa/part1.tar.xz"]: mkdir -p /tmp/fa && tar -C /tmp/fa -xJf .gpufa/part1.tar.xz
#   call 2, carry [".gpuwt"]:              cd .gpuwt && bash bench/gpu/lookahead_ab.sh [fleet_replay.py args]
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
out="${OUT:-/tmp}"
(
  source bench/gpu/device_env.sh
  timeout "${GRID_S:-200}" python3 bench/throughput_bench.py --models 1b \
    --modes auto,ahead-unqueued --grid "${GRID:-1000/500,128/500}" --grid-models 1b \
    --grid-seqs 512 --grid-batch 128 --grid-only --page-size 128 --kv-pages 1b:4600 \
    --agreement-models none --throughput-models none 2>&1 | tee "$out/grid.log"
)
left=$(( ${TOTAL_S:-570} - ($(date +%s) - start) ))
if [ "$left" -gt 200 ]; then
  TOTAL_S=$left BUDGET_S=$(( left - 40 )) bash bench/gpu/fleet_replay.sh run \
    --arms defaults,ahead-unqueued "$@"
fi
