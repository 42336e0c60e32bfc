#!/usr/bin/env bash
# bench/admit_stall_bench.py on the device's GPU with the 1b preset's KV pages (512 KiB in
# bf16, as the H100 fleet's): what a page onboarded from the host tier, or read from a disk
# tier, holds the core thread there (the simulator's admit_ms_per_host_page and
# admit_ms_per_disk_page), and the disk case with the reads on 4 and 8 threads against the
# default (1), and with the block files written behind. The model's forward is free, so no flash-attn: one
# call, with this checkout and the wheels the image lacks (fleet_replay.sh's list, in .whl):
#   here:  bash bench/gpu/admit_stall.sh pack <checkout>/.gpuas
#   call, carry [".gpuas"]:  cd .gpuas && bash bench/gpu/admit_stall.sh run
# Writes $OUT/admit_stall.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  pack)
    dest=${2:?pack DEST}
    rm -rf "$dest" && mkdir -p "$dest/.whl"
    git ls-files -z | xargs -0 cp --parents -t "$dest"
    git diff --quiet || echo "note: uncommitted changes travel too"
    for wheel in "${WHEELS:-../main/.whl}"/*.whl; do
      case "$(basename "$wheel")" in grpcio_tools-* | sglang_router-*) ;; *) cp "$wheel" "$dest/.whl/" ;; esac
    done
    du -sh "$dest"
    ;;
  run)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 2
    mkdir -p /tmp/kvshim/kvfleet
    for d in services kvstore proto operator; do ln -sfn "$PWD/$d" /tmp/kvshim/kvfleet/$d; done
    export PYTHONPATH=/tmp/kvshim:/tmp/site PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name --format=csv,noheader
    out="${OUT:-/tmp}"
    bench() {
      echo "## $*"
      python3 bench/admit_stall_bench.py --device cuda --kv-shape 1b --prompts "${PROMPTS:-65536}" \
        --repeats "${REPEATS:-3}" "$@" 2>&1 | grep -v "fleet secret"
    }
    {
      bench --where host,disk
      bench --where disk --disk-read-threads 4
      bench --where disk --disk-read-threads 8
      bench --where disk --disk-write-behind
    } | tee "$out/admit_stall.txt"
    ;;
  *) echo "usage: $0 pack DEST | run"; exit 2 ;;
esac
