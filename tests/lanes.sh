#!/usr/bin/env bash
# The whole suite in four lanes, each its own pytest process, run side by side:
#   fast     -m 'not slow'                      what to run while working
#   slow     -m slow, but the fresh installs     the API-server kit, TP workers, subprocess
#            and the cluster                    fleets, fuzzing, mypy
#   install  -m slow tests/packaging            the wheel in a fresh venv per extra
#   cluster  -m cluster tests/k8s               images built (cached) and a real one-node
#                                               cluster (root only; skipped otherwise)
# The slow lanes mostly wait (child processes, servers starting, pip), so side by side the suite
# takes about as long as its longest lane. The other lanes' output is shown when all are done;
# the exit status is non-zero when any lane failed. Extra arguments go to every lane.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
logs=$(mktemp -d -t kvfleet-lanes.XXXXXX)
# lane NAME PYTEST-ARGS...: one pytest process; its wall time goes to $logs/NAME.wall, so the
# summary can show how long each process lived past the duration pytest itself reports
# (the exit lag: threads still alive, the final collection).
lane() {
  local name=$1 start status
  shift
  start=$(date +%s.%N)
  "$python" -m pytest "$@"
  status=$?
  awk -v start="$start" -v end="$(date +%s.%N)" 'BEGIN { print end - start }' >"$logs/$name.wall"
  return $status
}
lane slow -m 'slow and not cluster' --ignore=tests/packaging "$@" >"$logs/slow" 2>&1 &
slow=$!
# -s: the lane prints each phase's time and every request and reply as it goes
lane cluster -m cluster -s tests/k8s "$@" >"$logs/cluster" 2>&1 &
cluster=$!
lane install -m slow tests/packaging "$@" >"$logs/install" 2>&1 &
install=$!
lane fast -m 'not slow' "$@" 2>&1 | tee "$logs/fast"
fast_status=${PIPESTATUS[0]}
wait "$slow"
slow_status=$?
wait "$install"
install_status=$?
wait "$cluster"
cluster_status=$?
for lane in slow install cluster; do
  echo "===== $lane lane ====="
  cat "$logs/$lane"
done
# pytest's own duration is on its summary line ("... in 123.45s (0:02:03)"), which is not always
# the last: what the interpreter prints at exit (a resource warning) comes after it
for lane in fast slow install cluster; do
  reported=$(grep -E '^=*.* in [0-9.]+s' "$logs/$lane" | tail -n 1 | sed -n 's/.* in \([0-9.]*\)s.*/\1/p')
  wall=$(cat "$logs/$lane.wall" 2>/dev/null || echo 0)
  awk -v lane="$lane" -v wall="$wall" -v reported="${reported:-0}" 'BEGIN {
    printf "lane %-8s wall %7.1f s, pytest %7.1f s, outside it (start + exit lag) %5.1f s\n",
      lane, wall, reported, wall - reported }'
done
rm -rf "$logs"
echo "lanes: fast exit $fast_status, slow exit $slow_status, install exit $install_status," \
  "cluster exit $cluster_status"
[ "$fast_status" -eq 0 ] && [ "$slow_status" -eq 0 ] && [ "$install_status" -eq 0 ] &&
  [ "$cluster_status" -eq 0 ]
