# shellcheck shell=bash
# Simulated hosts for the multi-host tests, benchmark and example
# (issue 14): network namespaces joined by veth links to one bridge, which
# lives in a "switch" namespace of its own, so nothing touches the root
# namespace's links.  Sourced by bash scripts (its functions keep their variables local).  Names carry the caller's PID
# (other agents and test runs make their own at the same time); mh_cleanup
# undoes everything and is safe to call twice.
#
#   mh_init TAG        namespaces are named "${TAG}$$-NAME"; exit 77, with
#                      a "skip:" reason, where `ip netns add`, `ip netns
#                      exec` (its mounts: a chroot refuses them) or a veth
#                      pair cannot be used (not root, no support)
#   mh_host NAME IDX   a host namespace with eth0 = 10.77.0.IDX/24 and lo up
#   mh_exec NAME CMD   runs CMD in host NAME
#   mh_bg NAME LOG CMD starts CMD in host NAME in the background, output to
#                      LOG; its PID is recorded (killed by mh_cleanup) and
#                      left in MH_PID
#   mh_ip IDX          10.77.0.IDX
#   mh_cleanup         kills what mh_bg started, deletes the namespaces
#
# A script killed outright (SIGKILL, as ctest does at its TIMEOUT) runs no
# trap, so mh_init also leaves a reaper outside the script's process tree:
# it waits for the script's PID to go, then kills whatever still runs in
# namespaces named "$MH_PFX-*" and deletes them (issue 24: failed runs left
# their switch namespaces behind).

MH_PIDS=""
MH_NETNS=""

# mh_tmp NAME: the run's temp dir in TMP (/tmp/ecs-NAME-XXXXXX, readable
# by the hosts' processes), a fail() that prints the tail of every log in it
# and exits 1, and on exit (INT and TERM included) the hosts torn down and
# TMP removed.
mh_tmp() {
  TMP=$(mktemp -d "/tmp/ecs-$1-XXXXXX")
  chmod 0755 "$TMP"
  trap mh_finish EXIT
  trap 'exit 1' INT TERM
}
fail() {
  echo "FAIL: $*" >&2
  for f in "$TMP"/*.log; do
    echo "---- $f" >&2
    tail -n 30 "$f" >&2
  done
  exit 1
}
mh_finish() {
  mh_cleanup
  rm -rf "$TMP"
}

mh_init() {
  MH_PFX="$1$$"
  if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null 2>&1; then
    echo "skip: network namespaces need root and iproute2" >&2
    exit 77
  fi
  if ! ip netns add "$MH_PFX-sw" 2>/dev/null; then
    echo "skip: ip netns add fails here (no namespace support)" >&2
    exit 77
  fi
  MH_NETNS="$MH_PFX-sw"
  mh_reaper "$$" "$MH_PFX"
  # `ip netns exec` needs more than `ip netns add`: a mount namespace in
  # which / can be made a slave and /sys remounted, which a chroot or a
  # container without CAP_SYS_ADMIN over its mounts refuses ("mount
  # --make-rslave /: Permission denied").  Try it, as every host command
  # will, and skip with its reason rather than fail later.
  local why
  if ! why=$(ip netns exec "$MH_PFX-sw" true 2>&1); then
    ip netns del "$MH_PFX-sw" 2>/dev/null
    MH_NETNS=""
    echo "skip: ip netns exec fails here ($(echo "$why" | head -n 1)): namespaces can be made but not entered" >&2
    exit 77
  fi
  # And the veth pair and bridge the hosts are joined with.
  if ! why=$(ip -n "$MH_PFX-sw" link add mhprobe0 type veth peer name mhprobe1 2>&1); then
    ip netns del "$MH_PFX-sw" 2>/dev/null
    MH_NETNS=""
    echo "skip: cannot make a veth pair here ($(echo "$why" | head -n 1))" >&2
    exit 77
  fi
  ip -n "$MH_PFX-sw" link del mhprobe0 2>/dev/null
  ip -n "$MH_PFX-sw" link add br0 type bridge || return 1
  ip -n "$MH_PFX-sw" link set br0 up || return 1
  ip -n "$MH_PFX-sw" link set lo up
}

# mh_reaper PID PFX: the reaper above.  Started through a subshell that
# exits at once, so it is re-parented and no kill of the script's tree
# reaches it; its output goes nowhere, so it holds no pipe of the caller's.
mh_reaper() {
  (
    setsid bash -c '
      while kill -0 "$1" 2>/dev/null; do sleep 1; done
      for ns in $(ip netns list 2>/dev/null | awk "{print \$1}"); do
        case "$ns" in
        "$2"-*)
          for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
          ip netns del "$ns" 2>/dev/null
          ;;
        esac
      done' mh-reaper "$1" "$2" </dev/null >/dev/null 2>&1 &
  )
}

mh_ip() {
  echo "10.77.0.$1"
}

mh_host() {
  local ns="$MH_PFX-$1"
  ip netns add "$ns" || return 1
  MH_NETNS="$MH_NETNS $ns"
  ip link add name eth0 netns "$ns" type veth peer name "p$2" netns "$MH_PFX-sw" || return 1
  ip -n "$MH_PFX-sw" link set "p$2" master br0 || return 1
  ip -n "$MH_PFX-sw" link set "p$2" up || return 1
  ip -n "$ns" addr add "$(mh_ip "$2")/24" dev eth0 || return 1
  ip -n "$ns" link set eth0 up || return 1
  ip -n "$ns" link set lo up || return 1
}

mh_exec() {
  local ns="$MH_PFX-$1"
  shift
  ip netns exec "$ns" "$@"
}

mh_bg() {
  local ns="$MH_PFX-$1" log="$2"
  shift 2
  ip netns exec "$ns" "$@" >"$log" 2>&1 &
  MH_PID=$!
  MH_PIDS="$MH_PIDS $MH_PID"
}

mh_cleanup() {
  local p ns
  for p in $MH_PIDS; do
    kill -9 "$p" 2>/dev/null
  done
  for p in $MH_PIDS; do
    wait "$p" 2>/dev/null
  done
  MH_PIDS=""
  for ns in $MH_NETNS; do
    ip netns del "$ns" 2>/dev/null
  done
  MH_NETNS=""
}

# mh_wait_tcp NAME HOST PORT SECS: waits until HOST:PORT accepts, from NAME.
mh_wait_tcp() {
  local i=0
  while [ "$i" -lt $(($4 * 10)) ]; do
    if mh_exec "$1" bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
    i=$((i + 1))
  done
  return 1
}
