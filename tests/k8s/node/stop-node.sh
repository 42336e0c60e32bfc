#!/usr/bin/env bash
# stop-node.sh: stop what start-node.sh started, by the PIDs it recorded (a reused PID is left
# alone: its /proc start time differs), then the pods' containers and shims (by the PIDs in
# containerd's task state), unmount everything under the state dir, delete the network namespace.
# Idempotent, and safe after a killed start or run.
#
# usage: stop-node.sh STATE_DIR      (root)
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO=$(cd "$HERE/../../.." && pwd -P)
# the kit sits next to the repository (or one level up from a worktree)
KIT=${KVFLEET_K8S_KIT:-$REPO/../shared/k8s}
[ -e "$KIT/start.sh" ] || KIT=${KVFLEET_K8S_KIT:-$REPO/../../shared/k8s}
NETNS=kvfleet-node
log() { printf 'node stop: %s\n' "$*" >&2; }
STATE=${1:-}
[ -n "$STATE" ] || { log "usage: stop-node.sh STATE_DIR"; exit 2; }
[ -d "$STATE" ] || { log "$STATE does not exist: nothing to stop"; exit 0; }
STATE=$(cd "$STATE" && pwd -P)
[ -e "$STATE/.kvfleet-node-state" ] || { log "$STATE is not a start-node.sh state dir: refusing"; exit 2; }

alive() { # PID STARTTIME
  local s
  s=$(awk '{print $3, $22}' "/proc/$1/stat" 2>/dev/null) || return 1
  case ${s%% *} in Z | X) return 1 ;; esac
  [ -z "$2" ] || [ "${s#* }" = "$2" ]
}
stop_pid() { # NAME PID STARTTIME: TERM (its session when it leads one), KILL after 10 s
  local name=$1 pid=$2 start=$3 i
  alive "$pid" "$start" || return 0
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
  for i in $(seq 100); do alive "$pid" "$start" || break; sleep 0.1; done
  if alive "$pid" "$start"; then kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null; fi
  for i in $(seq 50); do alive "$pid" "$start" || break; sleep 0.1; done
  log "$name (pid $pid) stopped"
}
stop_recorded() { # NAME
  local pf=$STATE/pids/$1.pid pid
  [ -e "$pf" ] || return 0
  pid=$(cat "$pf" 2>/dev/null)
  [[ $pid =~ ^[0-9]+$ ]] && [ "$pid" -gt 1 ] && [ "$pid" != $$ ] &&
    stop_pid "$1" "$pid" "$(cat "$STATE/pids/$1.start" 2>/dev/null)"
  rm -f "$pf" "$STATE/pids/$1.start"
}

# The watchdog first (it would run a second stop), the kubelet before the containers it restarts.
for name in watchdog kubelet kube-proxy kube-scheduler cluster-dns dnsmasq; do stop_recorded $name; done

# Pods: the containers' processes and their shims are not our children. containerd's task state
# names each container's init PID; its parent is the container's shim (checked: it serves our
# containerd's socket). Each one's network namespace (/var/run/netns/cni-*: containerd 1.6 puts
# them there) is noted by inode first, to be deleted once the processes are gone.
TASKS=$STATE/containerd/state/io.containerd.runtime.v2.task
pod_netns=" "
if [ -d "$TASKS" ]; then
  for bundle in "$TASKS"/*/*/; do
    [ -d "$bundle" ] || continue
    id=$(basename "$bundle")
    pid=$(cat "$bundle/init.pid" 2>/dev/null) || continue
    [[ $pid =~ ^[0-9]+$ ]] && grep -qs "$id" "/proc/$pid/cgroup" || continue
    pod_netns+="$(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null) "
    shim=$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null)
    kill -KILL "$pid" 2>/dev/null && log "container ${id:0:12}: killed pid $pid"
    if [[ $shim =~ ^[0-9]+$ ]] && [ "$shim" -gt 1 ] &&
      tr '\0' ' ' <"/proc/$shim/cmdline" 2>/dev/null | grep -q -- "-address $STATE/containerd/"; then
      kill -KILL "$shim" 2>/dev/null && log "container ${id:0:12}: killed shim $shim"
    fi
  done
fi
stop_recorded containerd

# The control plane (the kit's stop.sh, by its recorded PIDs).
[ ! -e "$STATE/cp/.kvfleet-k8s-state" ] || bash "$KIT/stop.sh" "$STATE/cp" >/dev/null 2>&1 ||
  log "the control plane's stop.sh failed (see $STATE/cp)"

# Every mount below the state dir and containerd's snapshots (deepest first), then the namespace.
unmount_below() { # DIR
  local m
  awk -v d="$1/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done
}
for i in 1 2 3; do
  unmount_below "$STATE"
  unmount_below "${KVFLEET_NODE_CACHE:-/var/cache/kvfleet-node}"
done
for ns in /var/run/netns/cni-*; do
  [ -e "$ns" ] || continue
  case $pod_netns in *" $(stat -L -c %i "$ns" 2>/dev/null) "*)
    ip netns delete "$(basename "$ns")" && log "pod network namespace $(basename "$ns") deleted" ;;
  esac
done
if [ -e /var/run/netns/$NETNS ] && [ "$(cat /run/kvfleet-node.state 2>/dev/null)" = "$STATE" ]; then
  ip netns delete $NETNS && log "network namespace $NETNS deleted"
fi
# The kubelet's pod cgroups (cgroupfs driver: /kubepods in each hierarchy), empty once the
# containers are gone.
for top in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
  [ -d "$top" ] && find "$top" -depth -type d -exec rmdir {} \; 2>/dev/null
done
[ "$(cat /run/kvfleet-node.state 2>/dev/null)" != "$STATE" ] || rm -f /run/kvfleet-node.state
left=0
for pf in "$STATE"/pids/*.pid; do [ -e "$pf" ] && left=1; done
[ $left = 0 ] && log "stopped"
exit $left
