#!/usr/bin/env bash
# bench/admit_stall_bench.py on the device's GPU with the 1b preset's KV pages (512 KiB in
# bf16, as the H100 fleet's): what a page onboarded from the host tier, or read from a disk
# tier, holds the core thread there (the simulator's admit_ms_per_host_page and
# admit_ms_per_disk_page), and the disk case with the reads on 1 thread against the default,
# and with the block files written behind. Needs the fleet replay's pack and call 1
# (fleet_replay.sh's header):
#   call 2, carry [".gpuwt"]:  cd .gpuwt && bash bench/gpu/admit_stall.sh [&& ... fleet_replay.sh run]
# Writes $OUT/admit_stall.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out="${OUT:-/tmp}"
bench() {
  echo "## $*"
  python3 bench/admit_stall_bench.py --device cuda --kv-shape 1b --prompts "${PROMPTS:-65536}" \
    --repeats "${REPEATS:-3}" "$@" 2>&1 | grep -v "fleet secret"
}
{
  bench --where host,disk
  bench --where disk --disk-read-threads 1
  bench --where disk --disk-write-behind
} | tee "$out/admit_stall.txt"
