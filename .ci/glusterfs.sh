#!/usr/bin/env bash
# A real shared file system for the tests: one GlusterFS volume (one brick), glusterd and the
# brick in a private network namespace (their TCP stays on its loopback), FUSE-mounted twice
# at $KVTIER_GLUSTER_DIR/hostA and .../hostB, two independent clients standing in for two hosts.
#
#   .ci/glusterfs.sh up       bring it up (a half-built or stale set-up is torn down first)
#   .ci/glusterfs.sh down     tear down whatever of it exists; always safe to run
#   .ci/glusterfs.sh status   exit 0 if both mounts answer
#   .ci/glusterfs.sh check    exit 0 if this machine can run it at all (root, /dev/fuse,
#                             glusterd, mount.glusterfs, ip netns); else say what is missing
#
# Needs root, /dev/fuse and Debian's glusterfs-server + glusterfs-client. Settings (env):
#   KVTIER_GLUSTER_DIR  (default /tmp/kvtier-gluster)   where state, brick and mounts live
#   KVTIER_GLUSTER_NS   (default kvtier-gfs)            network namespace name
#   KVTIER_GLUSTER_VOL  (default kvtier)                volume name (one per set-up: the brick's
#                                                       pid files live under /var/run/gluster/vols/)
#   KVTIER_GLUSTER_PING (default: GlusterFS's, 42 s)    network.ping-timeout of the volume
#   COHERENT=1          client caches off (direct-io, attribute/entry timeouts 0)
set -uo pipefail
S=${KVTIER_GLUSTER_DIR:-/tmp/kvtier-gluster}
NS=${KVTIER_GLUSTER_NS:-kvtier-gfs}
HOSTIP=127.0.0.2  # the gluster CLI refuses 127.0.0.1 and localhost as a brick host
VOL=${KVTIER_GLUSTER_VOL:-kvtier}
PING=${KVTIER_GLUSTER_PING:-}
COHERENT=${COHERENT:-0}
IN_NS=(nsenter "--net=/run/netns/$NS")
# glusterd's CLI socket is a file, not part of the network namespace: a socket of our own lets
# this set-up run beside another glusterd on the machine (the default one is shared).
SOCK=$S/glusterd.socket
CLI=(gluster --mode=script "--glusterd-sock=$SOCK")

check() {
  local missing=()
  [ "$(id -u)" = 0 ] || missing+=("root")
  [ -c /dev/fuse ] || missing+=("/dev/fuse")
  command -v glusterd >/dev/null || [ -x /usr/sbin/glusterd ] || missing+=("glusterd (apt install glusterfs-server)")
  command -v gluster >/dev/null || [ -x /usr/sbin/gluster ] || missing+=("gluster CLI (glusterfs-server)")
  [ -x /sbin/mount.glusterfs ] || [ -x /usr/sbin/mount.glusterfs ] || missing+=("mount.glusterfs (apt install glusterfs-client)")
  command -v ip >/dev/null || missing+=("ip (iproute2)")
  command -v nsenter >/dev/null || missing+=("nsenter (util-linux)")
  if ((${#missing[@]})); then
    echo "missing: ${missing[*]}"
    return 1
  fi
}

status() {
  mountpoint -q "$S/hostA" && mountpoint -q "$S/hostB" &&
    timeout 10 stat -f "$S/hostA" >/dev/null && timeout 10 stat -f "$S/hostB" >/dev/null
}

# The glusterfs client whose last argument is this mount point (pgrep names no other process).
client_pid() { pgrep -x glusterfs -a | awk -v m="$1" '$NF==m {print $1}'; }

down() {
  local h pid pf
  for h in hostA hostB; do
    pid=$(client_pid "$S/$h")
    [ -n "$pid" ] && kill -CONT $pid 2>/dev/null  # a test may have frozen it
    if mountpoint -q "$S/$h"; then
      umount "$S/$h" 2>/dev/null || umount -l "$S/$h"
    fi
    [ -n "$pid" ] && kill $pid 2>/dev/null
  done
  for pf in /var/run/gluster/vols/$VOL/*.pid; do
    [ -f "$pf" ] && kill -CONT "$(cat "$pf")" 2>/dev/null
  done
  if [ -f "$S/state/glusterd.pid" ] && kill -0 "$(cat "$S/state/glusterd.pid")" 2>/dev/null; then
    timeout 60 "${CLI[@]}" volume stop $VOL force >/dev/null 2>&1
    timeout 60 "${CLI[@]}" volume delete $VOL >/dev/null 2>&1
  fi
  for pf in /var/run/gluster/vols/$VOL/*.pid; do
    [ -f "$pf" ] && kill "$(cat "$pf")" 2>/dev/null
  done
  if [ -f "$S/state/glusterd.pid" ]; then
    pid=$(cat "$S/state/glusterd.pid")
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  fi
  ip netns del "$NS" 2>/dev/null
  rm -rf "$S/state" "$S/bricks" "/var/run/gluster/vols/$VOL"
  rm -f "$SOCK"
  if mountpoint -q "$S/hostA" || mountpoint -q "$S/hostB"; then
    echo "glusterfs.sh down: a mount is still there" >&2
    return 1
  fi
  return 0
}

up() {
  check >&2 || return 2
  status && return 0  # idempotent: already up and answering
  down || return 1
  mkdir -p "$S/etc" "$S/state/glusterd" "$S/log" "$S/bricks" "$S/hostA" "$S/hostB" || return 1
  ip netns add "$NS" && ip -n "$NS" link set lo up || return 1
  cat >"$S/etc/glusterd.vol" <<EOF
volume management
    type mgmt/glusterd
    option working-directory $S/state/glusterd
    option transport-type socket
    option transport.socket.keepalive-time 10
    option transport.socket.keepalive-interval 2
    option transport.socket.read-fail-log off
    option transport.socket.listen-port 24007
    option ping-timeout 0
    option event-threads 1
    option max-port  60999
    option glusterd-sockfile $SOCK
end-volume
EOF
  "${IN_NS[@]}" glusterd -f "$S/etc/glusterd.vol" -p "$S/state/glusterd.pid" \
    -l "$S/log/glusterd.log" --log-level WARNING || return 1
  local ok=0
  for _ in $(seq 1 100); do
    "${CLI[@]}" pool list >/dev/null 2>&1 && { ok=1; break; }
    sleep 0.1
  done
  [ $ok = 1 ] || { echo "glusterd did not answer (see $S/log/glusterd.log)" >&2; return 1; }
  "${CLI[@]}" volume create $VOL "$HOSTIP:$S/bricks/b1" force >/dev/null || return 1
  local mopts=""
  if [ "$COHERENT" = 1 ]; then
    for o in performance.write-behind performance.quick-read performance.stat-prefetch \
      performance.open-behind performance.io-cache performance.read-ahead; do
      "${CLI[@]}" volume set $VOL $o off >/dev/null || return 1
    done
    mopts=",direct-io-mode=enable,attribute-timeout=0,entry-timeout=0"
  fi
  if [ -n "$PING" ]; then
    "${CLI[@]}" volume set $VOL network.ping-timeout "$PING" >/dev/null || return 1
  fi
  "${CLI[@]}" volume start $VOL >/dev/null || return 1
  # Two independent FUSE clients = two "hosts". The client processes live in the network
  # namespace; the mounts are in the normal mount namespace (nsenter enters only --net).
  for h in hostA hostB; do
    "${IN_NS[@]}" mount -t glusterfs -o "log-file=$S/log/$h.log$mopts" \
      "$HOSTIP:/$VOL" "$S/$h" || return 1
  done
  status
}

case "${1:-}" in
  up)
    up
    rc=$?
    if [ $rc = 1 ]; then down >/dev/null 2>&1; fi  # never leave a half-built set-up behind
    exit $rc
    ;;
  down) down ;;
  status) status ;;
  check) check ;;
  *)
    echo "usage: $0 up|down|status|check" >&2
    exit 2
    ;;
esac
