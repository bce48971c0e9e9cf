#!/bin/bash
# A real distributed file system for the shared-root tests: one GlusterFS volume ("kv", one
# brick) served by a glusterd inside a private network namespace (its TCP stays on that
# namespace's loopback), FUSE-mounted twice at $GLUSTER_DIR/hostA and $GLUSTER_DIR/hostB:
# two "hosts" with independent clients and caches.
#
#   .ci/glusterfs.sh up      bring it up (about 3 s); prints the two mount points
#   .ci/glusterfs.sh down    tear down what "up" built (only processes recorded for it)
#
# Needs root, /dev/fuse, and the Debian packages glusterfs-server glusterfs-client.
# GLUSTER_DIR defaults to /tmp/kvtier-gluster-ci. COHERENT=1 turns the client caches off.
# The gluster CLI talks to glusterd over a fixed socket (/var/run/gluster/glusterd.socket):
# one set-up per machine at a time ("up" refuses when a glusterd already runs).
set -euo pipefail
S=${GLUSTER_DIR:-/tmp/kvtier-gluster-ci}
NS=kvtier-gfs
HOSTIP=127.0.0.2 # the gluster CLI refuses 127.0.0.1 and localhost as a brick host
VOL=kv
COHERENT=${COHERENT:-0}
IN_NS="nsenter --net=/run/netns/$NS"

up() {
  for h in hostA hostB; do
    mountpoint -q "$S/$h" && { echo "already up at $S (run: $0 down)" >&2; exit 1; }
  done
  pgrep -x glusterd >/dev/null && { echo "a glusterd already runs on this machine" >&2; exit 1; }
  mkdir -p "$S/etc" "$S/state/glusterd" "$S/log" "$S/bricks" "$S/hostA" "$S/hostB"
  ip netns add $NS
  ip -n $NS link set lo up
  cat >"$S/etc/glusterd.vol" <<EOF
volume management
    type mgmt/glusterd
    option working-directory $S/state/glusterd
    option transport-type socket
    option transport.socket.listen-port 24007
    option ping-timeout 0
    option event-threads 1
    option max-port 60999
end-volume
EOF
  $IN_NS /usr/sbin/glusterd -f "$S/etc/glusterd.vol" -p "$S/state/glusterd.pid" \
    -l "$S/log/glusterd.log" --log-level INFO
  for _ in $(seq 1 100); do
    gluster --mode=script pool list >/dev/null 2>&1 && break
    sleep 0.1
  done
  gluster --mode=script volume create $VOL $HOSTIP:"$S/bricks/b1" force >/dev/null
  opts=""
  if [ "$COHERENT" = 1 ]; then
    for o in performance.write-behind performance.quick-read performance.stat-prefetch \
      performance.open-behind performance.io-cache performance.read-ahead; do
      gluster --mode=script volume set $VOL $o off >/dev/null
    done
    opts=",direct-io-mode=enable,attribute-timeout=0,entry-timeout=0"
  fi
  gluster --mode=script volume start $VOL >/dev/null
  # Two independent FUSE clients; the client processes live in the namespace, the mounts in
  # the normal mount namespace (nsenter enters only the network namespace).
  for h in hostA hostB; do
    $IN_NS mount -t glusterfs -o "log-file=$S/log/$h.log$opts" $HOSTIP:/$VOL "$S/$h"
  done
  echo "$S/hostA $S/hostB $S/bricks/b1"
}

down() {
  for h in hostA hostB; do
    if mountpoint -q "$S/$h"; then
      pid=$(pgrep -x glusterfs -a | awk -v m="$S/$h" '$NF==m {print $1}')
      [ -n "$pid" ] && kill -CONT "$pid" 2>/dev/null
      umount "$S/$h" || umount -l "$S/$h"
      [ -n "$pid" ] && kill "$pid" 2>/dev/null
    fi
  done
  for pf in /var/run/gluster/vols/$VOL/*.pid; do
    [ -f "$pf" ] && kill -CONT "$(cat "$pf")" 2>/dev/null
  done
  if [ -f "$S/state/glusterd.pid" ] && kill -0 "$(cat "$S/state/glusterd.pid")" 2>/dev/null; then
    timeout 60 gluster --mode=script volume stop $VOL force >/dev/null 2>&1 || true
    timeout 60 gluster --mode=script volume delete $VOL >/dev/null 2>&1 || true
  fi
  for pf in /var/run/gluster/vols/$VOL/*.pid; do
    [ -f "$pf" ] && kill "$(cat "$pf")" 2>/dev/null
  done
  if [ -f "$S/state/glusterd.pid" ]; then
    pid=$(cat "$S/state/glusterd.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  fi
  ip netns del $NS 2>/dev/null || true
  rm -rf "$S/state" "$S/bricks" /var/run/gluster/vols/$VOL
  rm -f /var/run/gluster/*.socket 2>/dev/null || true
}

case "${1:-}" in
up) up ;;
down) down ;;
*)
  echo "usage: $0 up|down" >&2
  exit 2
  ;;
esac
