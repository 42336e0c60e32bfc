#!/usr/bin/env bash
# start-node.sh: a real one-node Kubernetes 1.20 cluster on this machine, everything network-facing
# inside a network namespace `kvfleet-node` (node IP 10.77.0.1 on a veth pair whose two ends both
# live there): the API-server kit's control plane (../../../shared/k8s, started from a patched copy
# of its start.sh: fixed ports, bound to the node IP), containerd + runc + bridge CNI, dnsmasq as
# cluster DNS, kubelet, kube-scheduler and kube-proxy v1.20.2 (the kit's node/bin/*.xz). Images
# come from docker/build-images.sh's store. One node per machine (the namespace name, the fixed
# cgroup root); a node left by a killed run is stopped first.
#
# usage: start-node.sh [--owner-pid PID] STATE_DIR       (root)
#   STATE_DIR   new or from an earlier start-node.sh; gets pids/, logs/, env
#   --owner-pid a watchdog runs stop-node.sh when that process is gone
#   env: KVFLEET_K8S_KIT (the kit), KVFLEET_IMAGE_CACHE (docker/build-images.sh's store),
#        KVFLEET_NODE_CACHE (containerd's content, default /var/cache/kvfleet-node), KUBECTL,
#        KVFLEET_NODE_IMAGES (images to load; default the project's, redis and pause)
# Installs its Debian packages (containerd, runc, bridge CNI, iptables, dnsmasq) when missing.
# stdout: export lines (KUBECONFIG, KVFLEET_NODE_NETNS, KVFLEET_NODE_IP, ...), also in STATE_DIR/env.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO=$(cd "$HERE/../../.." && pwd -P)
# the kit sits next to the repository (or one level up from a worktree)
KIT=${KVFLEET_K8S_KIT:-$REPO/../shared/k8s}
[ -e "$KIT/start.sh" ] || KIT=${KVFLEET_K8S_KIT:-$REPO/../../shared/k8s}
IMAGE_CACHE=${KVFLEET_IMAGE_CACHE:-/var/cache/kvfleet-images}
CACHE=${KVFLEET_NODE_CACHE:-/var/cache/kvfleet-node}
KUBECTL=${KUBECTL:-kubectl}
NETNS=kvfleet-node
NODE_IP=10.77.0.1
# Fixed ports (the namespace is the node's own): the usual ones, below the ephemeral range, so no
# outgoing connection inside the namespace holds one already.
TAG=${KVFLEET_IMAGE_TAG:-0.1.0}
IMAGES=${KVFLEET_NODE_IMAGES:-registry.k8s.io/pause:3.4.1 docker.io/library/redis:7.4-alpine ghcr.io/kvfleet/operator:$TAG ghcr.io/kvfleet/router:$TAG ghcr.io/kvfleet/engine:$TAG}
T0=$(date +%s%N)
log() { printf 'node start [%5s ms]: %s\n' "$((($(date +%s%N) - T0) / 1000000))" "$*" >&2; }
die() { log "error: $*"; exit 1; }

OWNER_PID=""
STATE=""
while [ $# -gt 0 ]; do
  case $1 in
    --owner-pid) OWNER_PID=$2; shift 2 ;;
    -h | --help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) STATE=$1; shift ;;
  esac
done
[ -n "$STATE" ] || die "usage: start-node.sh [--owner-pid PID] STATE_DIR"
[ "$(id -u)" = 0 ] || die "needs root (network namespace, containerd, kubelet)"
[ -x "$KIT/start.sh" ] || [ -f "$KIT/start.sh" ] || die "no API-server kit at $KIT (set KVFLEET_K8S_KIT)"
# Debian packages the node runs on, installed when missing (as docker/build-images.sh does its own)
need=()
for pair in containerd:containerd ctr:containerd runc:runc nsenter:util-linux ip:iproute2 \
  iptables:iptables dnsmasq:dnsmasq-base xz:xz-utils podman:podman \
  /usr/lib/cni/bridge:containernetworking-plugins; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  log "apt-get install ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >&2 ||
    { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y \
      --no-install-recommends "${need[@]}" >&2; } ||
    die "could not install ${need[*]} (apt-get install them, then run again)"
fi
for c in containerd ctr runc nsenter ip iptables dnsmasq xz podman /usr/lib/cni/bridge "$KUBECTL"; do
  command -v "$c" >/dev/null || die "$c is missing (apt-get install containerd runc containernetworking-plugins iptables dnsmasq-base podman)"
done
mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd -P)

# A node from a run that was killed (or this state dir's own earlier one) goes first.
RECORD=/run/kvfleet-node.state
if [ -e "/var/run/netns/$NETNS" ] || [ -e "$RECORD" ]; then
  previous=$(cat "$RECORD" 2>/dev/null || true)
  owner=$(cat "$previous/owner.pid" 2>/dev/null || true)
  if [ -n "$owner" ] && [ "$previous" != "$STATE" ] && kill -0 "$owner" 2>/dev/null; then
    die "a node owned by live pid $owner runs from $previous; stop it first (stop-node.sh $previous)"
  fi
  log "stopping the node left in ${previous:-(unknown state dir)}"
  bash "$HERE/stop-node.sh" "${previous:-$STATE}" >&2 || true
  [ ! -e "/var/run/netns/$NETNS" ] || ip netns delete "$NETNS"
fi
rm -rf "$STATE/pids" "$STATE/logs" "$STATE/containerd/state" "$STATE/dns" "$STATE/cni" "$STATE/env"
mkdir -p "$STATE"/{pids,logs,containerd,cni/net.d,kubelet,dns,models,disk} "$CACHE"
touch "$STATE/.kvfleet-node-state"
echo "$STATE" >"$RECORD"
echo "${OWNER_PID:-}" >"$STATE/owner.pid"

STARTED=0
on_exit() {
  local rc=$?
  if [ $STARTED != 1 ]; then
    for f in "$STATE"/logs/*.log; do [ -s "$f" ] && { echo "----- $f" >&2; tail -n 15 "$f" >&2; }; done
    bash "$HERE/stop-node.sh" "$STATE" >&2 || true
    log "start failed; stopped what it started"
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT TERM HUP

launch() { # NAME CMD...: detached (own session), PID recorded with its start time (as the kit's)
  local name=$1 pid="" i
  shift
  setsid bash -c 'echo $$ >"$0.tmp" && mv -f "$0.tmp" "$0" && exec "$@"' "$STATE/pids/$name.pid" "$@" \
    </dev/null >"$STATE/logs/$name.log" 2>&1 &
  for i in $(seq 250); do pid=$(cat "$STATE/pids/$name.pid" 2>/dev/null || true); [ -n "$pid" ] && break; sleep 0.02; done
  [ -n "$pid" ] || die "$name did not start"
  awk '{print $22}' "/proc/$pid/stat" >"$STATE/pids/$name.start"
}
wait_until() { # WHAT SECONDS CMD...
  local what=$1 seconds=$2 deadline=$(($(date +%s) + $2))
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || die "$what not ready after $seconds s"
    sleep 0.5
  done
}
NET=(nsenter "--net=/var/run/netns/$NETNS")
K=$STATE/cp/admin.kubeconfig
kc() { "${NET[@]}" "$KUBECTL" --kubeconfig "$K" "$@"; }

# ---------------------------------------------------------------- 1. the node's network namespace
ip netns add $NETNS
"${NET[@]}" ip link set lo up
"${NET[@]}" ip link add node0 type veth peer name node0p # both ends here: the node IP's interface
"${NET[@]}" ip addr add $NODE_IP/24 dev node0
"${NET[@]}" ip link set node0 up
"${NET[@]}" ip link set node0p up
"${NET[@]}" ip route add default dev node0
"${NET[@]}" sysctl -q -w net.ipv4.ip_forward=1
log "network namespace $NETNS, node IP $NODE_IP"

# ---------------------------------------------------------------- 2. control plane (the kit, patched copy)
mkdir -p "$STATE/kit"
sed -e "s|^KIT=.*|KIT=$KIT|" \
  -e 's|subjectAltName = IP:127.0.0.1, |subjectAltName = IP:127.0.0.1, IP:'$NODE_IP', |' \
  -e 's|<<<"$(pick_ports 4)"|<<<"6443 2379 2380 10257"|' \
  -e 's|--bind-address=127.0.0.1 --advertise-address=127.0.0.1|--bind-address='$NODE_IP' --advertise-address='$NODE_IP' --kubelet-preferred-address-types=InternalIP|' \
  -e 's|API_URL="https://127.0.0.1:$API_PORT"|API_URL="https://'$NODE_IP':$API_PORT"|' \
  "$KIT/start.sh" >"$STATE/kit/start.sh"
for want in "IP:$NODE_IP" 6443 "advertise-address=$NODE_IP" "https://$NODE_IP:"; do
  grep -q -- "$want" "$STATE/kit/start.sh" || die "the kit's start.sh changed: could not patch in $want"
done
"${NET[@]}" env KVFLEET_K8S_BIN_DIR="${KVFLEET_K8S_BIN_DIR:-$CACHE/kit-bin}" \
  bash "$STATE/kit/start.sh" "$STATE/cp" >"$STATE/logs/control-plane-start.log" 2>&1 ||
  die "control plane did not start: $(tail -n 20 "$STATE/logs/control-plane-start.log")"
log "control plane up at https://$NODE_IP:6443"

# ---------------------------------------------------------------- 3. containerd, images
# One content store per set of image builds, named by their IDs: a rebuilt image gets a fresh
# store and every image is imported into it whole. (Replacing an image in place, rm then import
# in one store, failed now and then with "content digest ...: not found".) Other sets' stores go.
export CONTAINERS_STORAGE_CONF=$IMAGE_CACHE/storage.conf
ids=""
for image in $IMAGES; do
  id=$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null) ||
    die "no image $image in $IMAGE_CACHE: run docker/build-images.sh"
  ids="$ids $image=$id"
done
STORE=$CACHE/containerd-$(echo "$ids" | sha256sum | cut -c1-16)
for old in "$CACHE"/containerd "$CACHE"/containerd-* "$CACHE"/imported; do
  [ "$old" = "$STORE" ] || [ ! -e "$old" ] || rm -rf "$old" || die "could not remove the old store $old"
done
sed -e "s|@STATE@|$STATE|g" -e "s|@STORE@|$STORE|g" "$HERE/containerd.toml" >"$STATE/containerd/config.toml"
sed -e "s|@STATE@|$STATE|g" "$HERE/bridge.conflist" >"$STATE/cni/net.d/10-bridge.conflist"
launch containerd "${NET[@]}" containerd --config "$STATE/containerd/config.toml"
CTR=("${NET[@]}" ctr -a "$STATE/containerd/containerd.sock" -n k8s.io)
wait_until containerd 60 "${CTR[@]}" version
for image in $IMAGES; do
  if "${CTR[@]}" images ls -q | grep -qx "$image"; then continue; fi
  podman save -q --format oci-archive -o "$STATE/image.tar" "$image"
  "${CTR[@]}" images import --base-name "${image%:*}" --index-name "$image" "$STATE/image.tar" >/dev/null
  rm -f "$STATE/image.tar"
  log "loaded $image"
done

# ---------------------------------------------------------------- 4. cluster DNS
launch dnsmasq "${NET[@]}" dnsmasq --keep-in-foreground --no-resolv --no-hosts --listen-address=$NODE_IP \
  --bind-interfaces --port=53 --addn-hosts="$STATE/dns/hosts" --local=/cluster.local/ --user=root
touch "$STATE/dns/hosts"
launch cluster-dns env KUBECTL="$KUBECTL" "${NET[@]}" bash "$HERE/cluster-dns.sh" "$STATE" "$(cat "$STATE/pids/dnsmasq.pid")"

# ---------------------------------------------------------------- 5. kubelet, scheduler, kube-proxy
BIN=$CACHE/node-bin
mkdir -p "$BIN"
for b in kubelet kube-scheduler kube-proxy; do
  want=$(awk -v b="$b" '$2 == b {print $1}' "$KIT/node/bin/SHA256SUMS")
  if [ "$(sha256sum "$BIN/$b" 2>/dev/null | cut -d' ' -f1)" != "$want" ]; then
    xz -dc "$KIT/node/bin/$b.xz" >"$BIN/$b.partial" && chmod 755 "$BIN/$b.partial" && mv "$BIN/$b.partial" "$BIN/$b"
  fi
done
launch kubelet "${NET[@]}" "$BIN/kubelet" --config="$HERE/kubelet-config.yaml" --kubeconfig="$K" \
  --container-runtime=remote --container-runtime-endpoint="unix://$STATE/containerd/containerd.sock" \
  --root-dir="$STATE/kubelet" --cert-dir="$STATE/kubelet/pki" --hostname-override=$NETNS \
  --node-ip=$NODE_IP --v=1
launch kube-scheduler "${NET[@]}" "$BIN/kube-scheduler" --kubeconfig="$K" --authentication-kubeconfig="$K" \
  --authorization-kubeconfig="$K" --leader-elect=false --port=0 --secure-port=10259 --bind-address=127.0.0.1
launch kube-proxy "${NET[@]}" "$BIN/kube-proxy" --kubeconfig="$K" --hostname-override=$NETNS \
  --proxy-mode=iptables --cluster-cidr=10.244.0.0/16 --bind-address=$NODE_IP \
  --healthz-bind-address=127.0.0.1:10256 --metrics-bind-address=127.0.0.1:10249 --conntrack-max-per-core=0 \
  --conntrack-min=0 --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0
node_ready() { kc get node $NETNS -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True; }
wait_until "node $NETNS" 120 node_ready
# The kit's controller-manager runs without the node-lifecycle controller: nothing else lifts
# the kubelet's start-up taint.
kc taint node $NETNS node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
log "node $NETNS Ready"

# ---------------------------------------------------------------- watchdog, env
if [ -n "$OWNER_PID" ]; then
  launch watchdog bash -c 'while kill -0 "$0" 2>/dev/null; do sleep 2; done; echo "owner $0 gone"; exec bash "$1" "$2"' \
    "$OWNER_PID" "$HERE/stop-node.sh" "$STATE"
fi
{
  printf 'export %s=%q\n' KUBECONFIG "$K" KVFLEET_NODE_DIR "$STATE" KVFLEET_NODE_NETNS "$NETNS" \
    KVFLEET_NODE_IP "$NODE_IP" KVFLEET_NODE_MODELS "$STATE/models" KVFLEET_NODE_DISK "$STATE/disk"
} >"$STATE/env"
STARTED=1
log "up"
cat "$STATE/env"
