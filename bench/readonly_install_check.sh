#!/usr/bin/env bash
# The router and operator images' install, without Docker: build kvfleet's wheel, install it
# with one extra (`router`, `operator`; pinned by docker/constraints.txt, no engine extra) into a
# fresh venv, make that venv read-only, then as a non-root user (nobody) run
# `kvfleet router --help` / `kvfleet operator --help`, import what each command serves with,
# and check that torch is not importable. Prints one line per extra with its install time.
#   bash bench/readonly_install_check.sh          # needs PyPI or a warm pip cache; run as root
# The same property is tested in-process by tests/packaging/test_extras_imports.py.
set -euo pipefail
cd "$(dirname "$0")/.."
# A Python that nobody may run (pyenv's under /root is not): the system's by default.
PYTHON=${PYTHON:-/usr/bin/python3}
work=$(mktemp -d /tmp/kvfleet-ro.XXXXXX)
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
chmod 755 "$work"
log="$work/pip.log"
"$PYTHON" -m venv "$work/build"
# Build from a copy of what the images copy: a build in the tree reuses its build/ folder, whose
# stale files would hide a package the configuration drops.
mkdir "$work/src"
cp -r pyproject.toml setup.py README.md kvstore services operator proto "$work/src"
"$work/build/bin/pip" wheel -q --no-deps -w "$work/wheels" "$work/src" 2>> "$log" \
  || { cat "$log"; exit 1; }
wheel=$(ls "$work"/wheels/kvfleet-*.whl)
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp "$@"; }
declare -A serves=(
  [router]="kvfleet.services.router.server kvfleet.proto.router_pb2_grpc"
  [operator]="kvfleet.operator.handlers"
)
printf '%-9s %-10s %s\n' extra install_s result
for extra in router operator; do
  venv="$work/$extra"
  "$PYTHON" -m venv "$venv"
  start=$(date +%s.%N)
  "$venv/bin/pip" install -q -c docker/constraints.txt "$wheel[$extra]" 2>> "$log" \
    || { cat "$log"; exit 1; }
  seconds=$(echo "$(date +%s.%N) - $start" | bc)
  chmod -R a-w "$venv"
  as_nobody "$venv/bin/kvfleet" "$extra" --help > "$work/$extra.help"
  grep -q "usage: kvfleet $extra" "$work/$extra.help"
  for module in ${serves[$extra]}; do
    as_nobody "$venv/bin/python" -c "import $module"
  done
  if as_nobody "$venv/bin/python" -c "import torch" 2> /dev/null; then
    echo "$extra: torch is importable" >&2
    exit 1
  fi
  if as_nobody touch "$venv/lib/probe" 2> /dev/null; then
    echo "$extra: the venv is writable" >&2
    exit 1
  fi
  printf '%-9s %-10.1f %s\n' "$extra" "$seconds" "ok: --help ran read-only as nobody, no torch"
done
