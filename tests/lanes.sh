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
"$python" -m pytest -m 'slow and not cluster' --ignore=tests/packaging "$@" >"$logs/slow" 2>&1 &
slow=$!
# -s: the lane prints each phase's time and every request and reply as it goes
"$python" -m pytest -m cluster -s tests/k8s "$@" >"$logs/cluster" 2>&1 &
cluster=$!
"$python" -m pytest -m slow tests/packaging "$@" >"$logs/install" 2>&1 &
install=$!
"$python" -m pytest -m 'not slow' "$@"
fast_status=$?
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
rm -rf "$logs"
echo "lanes: fast exit $fast_status, slow exit $slow_status, install exit $install_status," \
  "cluster exit $cluster_status"
[ "$fast_status" -eq 0 ] && [ "$slow_status" -eq 0 ] && [ "$install_status" -eq 0 ] &&
  [ "$cluster_status" -eq 0 ]
