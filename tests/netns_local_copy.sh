#!/usr/bin/env bash
# A get with a copy on this host and another on a remote host reads the
# local one (issue 24; docs/multihost.md "Replicas": nearest first, shm
# under transport auto).  Network namespaces, as root (exit 77 elsewhere):
# Redis on r, servers on h1 and h2.  Each object is stored on h2 first and
# then on h1, so the record lists the remote copy (h2) first and names it
# as the last writer only if the client's own ordering is wrong; a client
# on h1 then reads every object, and h1's server must have served every
# hit while h2's served none.
#
# usage: netns_local_copy.sh BIN_DIR
set -u
BIN=${1:?usage: netns_local_copy.sh BIN_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/netns_hosts.sh
. "$HERE/netns_hosts.sh"
command -v redis-server >/dev/null || { echo "skip: no redis-server" >&2; exit 77; }

mh_tmp lc

mh_init e8lc
for h in r:1 h1:11 h2:12; do
  mh_host "${h%%:*}" "${h##*:}" || fail "cannot make host ${h%%:*}"
done
REDIS="$(mh_ip 1):6379"
NS=lc
DRV="$BIN/ecs-mh-driver"
mh_bg r "$TMP/redis.log" redis-server --port 6379 --bind "$(mh_ip 1)" --save '' --appendonly no \
  --protected-mode no --daemonize no
mh_wait_tcp r "$(mh_ip 1)" 6379 10 || fail "redis did not start"
for h in h1:11 h2:12; do
  mh_bg "${h%%:*}" "$TMP/server-${h%%:*}.log" "$BIN/ecstore-server" --listen "$(mh_ip "${h##*:}"):7700" \
    --unprotected --redis "$REDIS" --ns "$NS" --pool-size 64M --shm-socket "$TMP/${h%%:*}.sock"
  mh_wait_tcp "${h%%:*}" "$(mh_ip "${h##*:}")" 7700 20 || fail "ecstore-server on ${h%%:*} did not start"
done

N=16
for h in h2 h1; do # the remote copy first
  out=$(mh_exec "$h" timeout 60 "$DRV" put --redis "$REDIS" --ns "$NS" --placement local --prefix lc --n $N \
    --size 64K) || fail "put on $h: $out"
done
hits() { # hits HOST IDX: the hits counter of that host's server
  mh_exec "$1" timeout 30 "$BIN/ecstore-cli" --server "$(mh_ip "$2"):7700" --ns "$NS" stat --json |
    tr ',{' '\n\n' | sed -n 's/^ *"hits": *\([0-9]*\).*/\1/p' | head -n 1
}
h1_0=$(hits h1 11)
h2_0=$(hits h2 12)
[ -n "$h1_0" ] && [ -n "$h2_0" ] || fail "cannot read the servers' hit counters"

echo lc >"$TMP/ctl"
mh_exec h1 timeout 60 "$DRV" getloop --redis "$REDIS" --ns "$NS" --ctl "$TMP/ctl" --n $N --size 64K \
  --rounds 3 --interval-ms 10 >"$TMP/get.log" 2>&1 || fail "the client on h1 failed"
cat "$TMP/get.log"
[ "$(grep -c "^round=.* ok=$N .*wrong=0" "$TMP/get.log")" = 3 ] || fail "not every object read right in 3 rounds"
h1_1=$(hits h1 11)
h2_1=$(hits h2 12)
echo "hits: h1's server $h1_0 -> $h1_1, h2's server $h2_0 -> $h2_1"
[ $((h1_1 - h1_0)) = $((3 * N)) ] || fail "the local server served $((h1_1 - h1_0)) of $((3 * N)) gets"
[ "$h2_1" = "$h2_0" ] || fail "the remote copy was read $((h2_1 - h2_0)) times though a local one exists"
echo "PASS: the local copy is read"
