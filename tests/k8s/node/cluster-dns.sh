#!/usr/bin/env bash
# Cluster DNS stand-in: every Service's ClusterIP as <svc>.<ns>.svc.cluster.local in a hosts
# file that dnsmasq (in the node's namespace) serves; rewritten (and dnsmasq reloaded) every 2 s.
# usage: cluster-dns.sh STATE_DIR DNSMASQ_PID   (KUBECTL: the kubectl to use)
set -uo pipefail
STATE=$1 DNSMASQ=$2
H=$STATE/dns/hosts
while kill -0 "$DNSMASQ" 2>/dev/null; do
  "${KUBECTL:-kubectl}" --kubeconfig "$STATE/cp/admin.kubeconfig" get svc -A -o \
    jsonpath='{range .items[*]}{.spec.clusterIP} {.metadata.name}.{.metadata.namespace}.svc.cluster.local{"\n"}{end}' \
    2>/dev/null | awk '$1 != "None" && $1 != ""' >"$H.new"
  if ! cmp -s "$H.new" "$H"; then mv "$H.new" "$H" && kill -HUP "$DNSMASQ"; fi
  sleep 2
done
