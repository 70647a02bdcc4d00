#!/usr/bin/env bash
# Simulated hosts leave nothing behind (issue 24, item 7): a multi-host
# script that fails runs its trap and deletes its namespaces; one killed
# outright (SIGKILL, as ctest does at a TIMEOUT, so no trap runs) has its
# namespaces, and the processes it started in them, removed by the reaper
# tests/netns_hosts.sh leaves at mh_init.  As root; exit 77 elsewhere.
#
# usage: netns_cleanup.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null 2>&1; then
  echo "skip: network namespaces need root and iproute2" >&2
  exit 77
fi
TMP=$(mktemp -d /tmp/ecs-nc-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# A child script: two hosts, a process in one of them, then either a
# failure (exit 1 through its trap) or a long sleep to be killed in.
cat >"$TMP/child.sh" <<CHILD
set -u
. "$HERE/netns_hosts.sh"
trap mh_cleanup EXIT
trap 'exit 1' INT TERM
mh_init e8nc
mh_host a 11 || exit 1
mh_host b 12 || exit 1
mh_bg a "$TMP/sleep.log" sleep 300
echo "\$MH_PFX \$MH_PID" >"$TMP/ready.\$1"
if [ "\$1" = fail ]; then exit 1; fi
while :; do sleep 0.2; done # nothing of its own outlives a SIGKILL by long
CHILD

left() { # namespaces with prefix $1
  ip netns list 2>/dev/null | awk '{print $1}' | grep -c "^$1-" || true
}

wait_ready() {
  local i
  for i in $(seq 100); do
    [ -s "$TMP/ready.$1" ] && return 0
    sleep 0.1
  done
  echo "FAIL: the child ($1) did not set up its hosts" >&2
  exit 1
}

# 1. a failing script: its trap deletes everything before it exits
bash "$TMP/child.sh" fail >"$TMP/child.log" 2>&1
rc=$?
wait_ready fail
read -r pfx pid <"$TMP/ready.fail"
[ "$rc" = 1 ] || { echo "FAIL: the failing child exited $rc" >&2; exit 1; }
[ "$(left "$pfx")" = 0 ] || { echo "FAIL: $(left "$pfx") namespaces of $pfx left after a failed run" >&2; exit 1; }
! kill -0 "$pid" 2>/dev/null || { echo "FAIL: its process $pid still runs" >&2; exit 1; }

# 2. a script killed with SIGKILL (no trap): the reaper cleans up
bash "$TMP/child.sh" kill >"$TMP/child.log" 2>&1 &
child=$!
wait_ready kill
read -r pfx pid <"$TMP/ready.kill"
[ "$(left "$pfx")" = 3 ] || { echo "FAIL: expected 3 namespaces of $pfx, found $(left "$pfx")" >&2; exit 1; }
kill -9 "$child" # the script alone: what it started in its namespaces is the reaper's
wait "$child" 2>/dev/null
for i in $(seq 100); do
  [ "$(left "$pfx")" = 0 ] && break
  sleep 0.1
done
[ "$(left "$pfx")" = 0 ] || { echo "FAIL: $(left "$pfx") namespaces of $pfx left 10 s after a SIGKILL" >&2; exit 1; }
for i in $(seq 50); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
! kill -0 "$pid" 2>/dev/null || { echo "FAIL: the process $pid it started in a namespace still runs" >&2; exit 1; }
echo "ok: failed and killed multi-host scripts leave no namespaces or processes"
