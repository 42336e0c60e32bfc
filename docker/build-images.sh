#!/usr/bin/env bash
# Build kvfleet's images without a Docker daemon or Docker Hub (buildah/podman as root, overlay
# storage, chroot isolation, runc), from docker/*.Dockerfile unmodified, plus what a one-node
# cluster needs (docker/local-node/): the python:3.11.7-slim-bookworm stand-in (Debian bookworm
# from debootstrap), redis, pause. Then runs each image read-only as its non-root user.
#
# usage: docker/build-images.sh            (root; installs its Debian packages when missing)
#   KVFLEET_IMAGE_CACHE  image store, debootstrap tarball, torch index (default
#                        /var/cache/kvfleet-images); an image whose inputs (its Containerfile,
#                        build args, the files it copies, its base image) hash the same as the
#                        stored one's label is not rebuilt, so a second run takes seconds.
#   KVFLEET_IMAGE_TAG    tag of the router, operator and engine images (default 0.1.0)
# The engine is the CPU variant: BASE_IMAGE the bookworm stand-in, PYTHON=python3.11,
# FLASH_ATTN=0, TORCH_INDEX_URL a local index holding torch 2.13.0 (pip download: the CPU wheel
# where pip's config provides it) and its dependencies.
# Use the same store elsewhere with: export CONTAINERS_STORAGE_CONF=$KVFLEET_IMAGE_CACHE/storage.conf
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
LOCAL=$REPO/docker/local-node
CACHE=${KVFLEET_IMAGE_CACHE:-/var/cache/kvfleet-images}
TAG=${KVFLEET_IMAGE_TAG:-0.1.0}
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
LABEL=dev.kvfleet.inputs-sha256
T0=$(date +%s)
log() { printf 'images [%4ss]: %s\n' "$(($(date +%s) - T0))" "$*" >&2; }
die() { log "error: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (buildah's chroot isolation and the image store need it)"

# ---------------------------------------------------------------- packages (only what is missing)
need=()
for pair in buildah:buildah podman:podman debootstrap:debootstrap runc:runc newuidmap:uidmap \
  gcc:gcc; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >&2 ||
    { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y \
      --no-install-recommends "${need[@]}" >&2; }
fi

# ---------------------------------------------------------------- container settings of this store
mkdir -p "$CACHE"
# overlay: a container or a layer costs no copy of the image (vfs copies whole trees: 2 GB per
# engine run); KVFLEET_IMAGE_DRIVER=vfs where overlay cannot mount.
DRIVER=${KVFLEET_IMAGE_DRIVER:-overlay}
printf '[storage]\ndriver = "%s"\ngraphroot = "%s/storage-%s"\nrunroot = "%s/run-%s"\n' \
  "$DRIVER" "$CACHE" "$DRIVER" "$CACHE" "$DRIVER" >"$CACHE/storage.conf"
export CONTAINERS_STORAGE_CONF=$CACHE/storage.conf CONTAINERS_REGISTRIES_CONF=$LOCAL/registries.conf \
  CONTAINERS_CONF=$LOCAL/containers.conf BUILDAH_ISOLATION=chroot

image_label() { podman image inspect --format "{{index .Labels \"$LABEL\"}}" "$1" 2>/dev/null || true; }
image_id() { podman image inspect --format '{{.Id}}' "$1"; }
tree_hash() { # PATH...: one hash of the files' names and contents (no caches, no venvs)
  (cd "$REPO" && find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z |
    xargs -0 sha256sum) | sha256sum | cut -c1-64
}
inputs_hash() { printf '%s\n' "$@" | sha256sum | cut -c1-64; }

# ---------------------------------------------------------------- debian base (debootstrap)
DEB_IMAGE=localhost/debian:bookworm-debootstrap
deb_key=$(inputs_hash debootstrap minbase "$SUITE" "$MIRROR" ca-certificates)
if [ "$(image_label $DEB_IMAGE)" != "$deb_key" ]; then
  tarball=$CACHE/debootstrap-$deb_key.tar
  if [ ! -s "$tarball" ]; then
    log "debootstrap $SUITE (minbase)"
    rootfs=$CACHE/rootfs.partial
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$rootfs" "$MIRROR" >&2
    tar -C "$rootfs" -cf "$tarball.partial" . && mv "$tarball.partial" "$tarball"
    rm -rf "$rootfs"
  fi
  podman import --change 'CMD ["/bin/bash"]' --change "LABEL $LABEL=$deb_key" "$tarball" $DEB_IMAGE >&2
fi

# ---------------------------------------------------------------- builds, skipped when inputs match
built=()
build() { # IMAGE CONTAINERFILE CONTEXT INPUTS-HASH [buildah bud args...]
  local image=$1 file=$2 context=$3 key=$4 t
  shift 4
  if [ "$(image_label "$image")" = "$key" ]; then
    log "$image: up to date"
  else
    t=$(date +%s)
    log "$image: building"
    # --layers: a step whose inputs did not change is taken from the store (the images install
    # their dependencies before they copy the code, so a code change rebuilds seconds of it)
    buildah bud --layers --pull=never --label "$LABEL=$key" "$@" -f "$file" -t "$image" "$context" >&2
    log "$image: built in $(($(date +%s) - t)) s"
  fi
  built+=("$image")
}

# The base stand-in carries this machine's extra CA certificates (an egress proxy may need them).
PY_IMAGE=docker.io/library/python:3.11.7-slim-bookworm
mkdir -p "$CACHE/python-base/ca"
cp "$LOCAL/python-base.Containerfile" "$CACHE/python-base/"
find /usr/local/share/ca-certificates -name '*.crt' -exec cp {} "$CACHE/python-base/ca/" \; 2>/dev/null || true
touch "$CACHE/python-base/ca/.keep"
build $PY_IMAGE "$CACHE/python-base/python-base.Containerfile" "$CACHE/python-base" \
  "$(inputs_hash "$(image_id $DEB_IMAGE)" "$(cd "$CACHE" && tree_hash python-base)")"

build docker.io/library/redis:7.4-alpine "$LOCAL/redis.Containerfile" "$LOCAL" \
  "$(inputs_hash "$(image_id $DEB_IMAGE)" "$(tree_hash docker/local-node/redis.Containerfile)")"

mkdir -p "$CACHE/pause"
pause_key=$(inputs_hash "$(tree_hash docker/local-node/pause.c docker/local-node/pause.Containerfile)")
if [ "$(image_label registry.k8s.io/pause:3.4.1)" != "$pause_key" ]; then
  gcc -Os -static -o "$CACHE/pause/pause" "$LOCAL/pause.c" && strip "$CACHE/pause/pause"
fi
build registry.k8s.io/pause:3.4.1 "$LOCAL/pause.Containerfile" "$CACHE/pause" "$pause_key"

SOURCES=(pyproject.toml setup.py README.md docker/constraints.txt docker/flash-attn.txt kvstore
  services operator proto)
src_hash=$(tree_hash "${SOURCES[@]}")
py_id=$(image_id $PY_IMAGE)
for name in router operator; do
  build "ghcr.io/kvfleet/$name:$TAG" "$REPO/docker/$name.Dockerfile" "$REPO" \
    "$(inputs_hash "$py_id" "$src_hash" "$(tree_hash "docker/$name.Dockerfile")")"
done

# torch 2.13.0 and its dependencies as a PEP 503 index on disk (pip's config on this machine may
# point at a CPU wheel; PyPI's is the CUDA build)
INDEX=$CACHE/torch-index
if [ ! -e "$INDEX/.complete" ]; then
  log "pip download torch==2.13.0 into a local index"
  rm -rf "$INDEX" && mkdir -p "$INDEX/files"
  python3 -m pip download -q --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
    --no-cache-dir -d "$INDEX/files" torch==2.13.0 >&2
  python3 - "$INDEX" <<'PY'
import pathlib, re, sys
root = pathlib.Path(sys.argv[1])
for wheel in sorted((root / "files").iterdir()):
    project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
    page = root / "simple" / project
    page.mkdir(parents=True, exist_ok=True)
    with open(page / "index.html", "a") as out:
        out.write(f'<a href="../../files/{wheel.name}">{wheel.name}</a>\n')
PY
  touch "$INDEX/.complete"
fi
ls "$INDEX/files" | grep -q '^torch-2\.13\.0+cpu' || log "warning: the local torch wheel is not the CPU build"
build "ghcr.io/kvfleet/engine:$TAG" "$REPO/docker/engine.Dockerfile" "$REPO" \
  "$(inputs_hash "$py_id" "$src_hash" "$(tree_hash docker/engine.Dockerfile)" \
    "$(cd "$INDEX" && tree_hash files)" cpu python3.11)" \
  --volume "$INDEX:/torch-index:ro" --build-arg BASE_IMAGE=$PY_IMAGE --build-arg PYTHON=python3.11 \
  --build-arg FLASH_ATTN=0 --build-arg TORCH_INDEX_URL=file:///torch-index/simple

# ---------------------------------------------------------------- run each one read-only, non-root
run() { # IMAGE CMD...: read-only root (tmpfs /tmp), no network, the image's own user
  podman run --rm --read-only --network none "$@"
}
check() { # WHAT IMAGE CMD...
  local what=$1
  shift
  if ! out=$(run "$@" 2>&1); then
    printf '%s\n' "$out" | tail -n 30 >&2
    die "$what failed"
  fi
  log "ok: $what"
}
for name in router operator engine; do
  check "kvfleet $name --help (user $(podman image inspect --format '{{.User}}' "ghcr.io/kvfleet/$name:$TAG"))" \
    "ghcr.io/kvfleet/$name:$TAG" kvfleet $name --help
  [ "$(podman image inspect --format '{{.User}}' "ghcr.io/kvfleet/$name:$TAG")" = 10001 ] ||
    die "ghcr.io/kvfleet/$name:$TAG does not run as user 10001"
done
# A real start: serve, answer /health, stop. The router alone; the engine image as a whole fleet
# in one process (`kvfleet up --smoke`: router + a rank on a tiny random checkpoint, real torch
# on CPU, a two-turn conversation through both APIs).
PROBE='import sys, time, urllib.error, urllib.request
url = sys.argv[1]
for _ in range(600):
    try:
        print(url, urllib.request.urlopen(url, timeout=2).status)
        break
    except urllib.error.HTTPError as error:  # it answered (503: no ranks yet)
        print(url, error.code)
        break
    except OSError:
        time.sleep(0.5)
else:
    sys.exit("no answer from " + url)'
check "router serves /health" "ghcr.io/kvfleet/router:$TAG" sh -c \
  "kvfleet router --host 127.0.0.1 --insecure-rank-port --metrics-port -1 --http-port 8000 & \
   python -c '$PROBE' http://127.0.0.1:8000/health; s=\$?; kill \$!; exit \$s"
check "operator imports its handlers" "ghcr.io/kvfleet/operator:$TAG" \
  python -c 'import kvfleet.operator.handlers'
check "engine answers a two-turn chat (kvfleet up --smoke, tiny random Qwen3)" \
  "ghcr.io/kvfleet/engine:$TAG" sh -c \
  "kvfleet model-dir --arch Qwen3ForCausalLM /tmp/m >/dev/null && kvfleet up --model-path /tmp/m --ranks 1 --smoke"
check "redis-server answers PING" docker.io/library/redis:7.4-alpine sh -c \
  'redis-server --bind 127.0.0.1 --save "" & ok=1
   for i in $(seq 100); do redis-cli ping && { ok=0; break; }; sleep 0.2; done; kill $!; exit $ok'

log "images (podman images):"
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'kvfleet|python|redis|pause' >&2
log "done"
