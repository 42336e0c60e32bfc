#!/usr/bin/env bash
# The real fleet on one H200 (bench/fleet_replay.py): router + 4 engine ranks (1b preset, random
# bf16 weights, flash-attn, CUDA graphs), each arm a fresh fleet replaying the same sessions
# through the router's OpenAI front. Two device calls made back to back (flash-attn travels as
# two archives, see ../shared/gpu/README.md; the machine stays warm ~30 s between calls).
# The device copies the lead's checkout, so this worktree travels as an ignored folder of it:
#   here:   ../shared/gpu/prepare-flash-attn.sh <checkout>/.gpufa, and in <checkout>/.whl the
#           wheels the image lacks, fetched with the device README's `pip download` line:
#           grpcio==1.85.1 protobuf==7.36.2 grpcio-health-checking==1.85.1
#           grpcio-reflection==1.85.1 redis==8.1.0 pydantic==2.14.3 pydantic-core==2.50.4
#           annotated-types typing-inspection typing-extensions fastapi==0.163.2 starlette
#           opentelemetry-api uvicorn==0.54.0 blake3==1.0.11 llguidance==1.9.1 (manylinux_2_31)
#           and, for the sglang/cache_aware arm, sglang-router==0.3.2 setproctitle orjson
#           aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl idna
#           (all in <checkout>/.git/info/exclude)
#           bash bench/gpu/fleet_replay.sh pack <checkout>/.gpuwt [--sessions DIR] [--count N]
#           (copies the tree, the sessions, part2 and the wheels into the ignored .gpuwt)
#   call 1, carry [".gpufa/part1.tar.xz"]:  mkdir -p /tmp/fa && tar -C /tmp/fa -xJf .gpufa/part1.tar.xz
#   call 2, carry [".gpuwt"]:               cd .gpuwt && bash bench/gpu/fleet_replay.sh run [args]
# `run` passes its arguments to fleet_replay.py and writes $OUT/<arm>.json, $OUT/fleet.json and
# $OUT/logs.tar.gz (every process's log).
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  pack)
    dest=${2:?pack DEST}; shift 2
    sessions=""; count=12
    while [ $# -gt 0 ]; do
      case "$1" in --sessions) sessions=$2; shift 2 ;; --count) count=$2; shift 2 ;; *) shift ;; esac
    done
    rm -rf "$dest" && mkdir -p "$dest"
    git ls-files -z | xargs -0 cp --parents -t "$dest"
    git diff --quiet || echo "note: uncommitted changes travel too"
    git ls-files -z --others --exclude-standard | xargs -0 -r cp --parents -t "$dest"
    mkdir -p "$dest/.traces" "$dest/.gpu"
    # The sessions: the given folder's first N, or the shared report half's (fleet_sizing.py).
    .venv/bin/python - "$dest/.traces" "$sessions" "$count" <<'PY'
import shutil, sys
from pathlib import Path
sys.path.insert(0, "bench")
from fleet_sizing import report_half
dest, folder, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
files = sorted(Path(folder).glob("*.json*"))[:count] if folder else report_half(
    Path("..") / "shared" / "traces" / "claude_code_weka", count, 131072)
for f in files:
    shutil.copy(f, dest)
print(f"{len(files)} sessions: {' '.join(f.stem for f in files)}")
PY
    # A call carries 64 MiB: the sessions travel as xz, grpcio-tools (codegen only) stays
    # here, and sglang-router's 90 MB library (the sglang/cache_aware arm) travels as xz too.
    tar -C "$dest" -cJf "$dest/.gpu/traces.tar.xz" .traces && rm -rf "$dest/.traces"
    cp "${FA_DIR:-../main/.gpufa}/part2.tar.xz" "$dest/.gpu/" && mkdir -p "$dest/.whl"
    for wheel in "${WHEELS:-../main/.whl}"/*.whl; do
      case "$(basename "$wheel")" in
        grpcio_tools-*) ;;
        sglang_router-*) site=$(mktemp -d) && unzip -q "$wheel" -d "$site" \
                           && tar -C "$site" -cf - . | xz -T0 -9 > "$dest/.gpu/sglang_router.tar.xz" \
                           && rm -rf "$site" ;;
        *) cp "$wheel" "$dest/.whl/" ;;
      esac
    done
    du -sh "$dest"
    ;;
  run)
    shift
    if [ ! -d /tmp/fa/flash_attn ]; then echo "fresh machine: run call 1 (unpack part1) first"; exit 2; fi
    source bench/gpu/device_env.sh
    tar -xJf .gpu/traces.tar.xz || exit 2
    if [ -f .gpu/sglang_router.tar.xz ]; then tar -C /tmp/site -xJf .gpu/sglang_router.tar.xz || exit 2; fi
    # kvfleet's import names map its folders (pyproject's package-dir); no install here.
    mkdir -p /tmp/kvshim/kvfleet
    for d in services kvstore proto operator; do ln -sfn "$PWD/$d" /tmp/kvshim/kvfleet/$d; done
    export PYTHONPATH=/tmp/kvshim:$PYTHONPATH
    out="${OUT:-/tmp/fleet_out}"; mkdir -p "$out"
    # The call's limit is 600 s: setup above takes ~20 s, the copies below a few.
    timeout "${TOTAL_S:-570}" python3 bench/fleet_replay.py --sessions .traces --out /tmp/fr \
      --budget-s "${BUDGET_S:-540}" "$@" 2>&1 | tee "$out/fleet_replay.log"
    cp /tmp/fr/*.json "$out/" 2>/dev/null
    tar -C /tmp/fr -czf "$out/logs.tar.gz" --exclude='*.json' --exclude=disk-tier . 2>/dev/null
    ;;
  *) echo "usage: $0 pack DEST [--sessions DIR] [--count N] | run [fleet_replay.py args]"; exit 2 ;;
esac
