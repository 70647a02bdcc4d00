#!/usr/bin/env bash
# Published suspicion (issue 24): three servers on h1..h3, h2's link cut
# (its switch port: h2 keeps running and stays in the registry, whose TTL
# here is 10 s).  Client A on h4 reads batches spanning all three and pays
# one deadline for h2, then marks it suspect in Redis.  Client B, another
# process on h5 that never met h2, started after that: every one of its
# calls answers h2's items as clean misses at once, never waiting its own
# deadline for h2 (before, its first call paid the full deadline).
# Network namespaces, as root (exit 77 elsewhere).
#
# usage: netns_suspect.sh BIN_DIR
set -u
BIN=${1:?usage: netns_suspect.sh BIN_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/netns_hosts.sh
. "$HERE/netns_hosts.sh"
command -v redis-server >/dev/null || { echo "skip: no redis-server" >&2; exit 77; }

mh_tmp su

mh_init e8su
for h in r:1 h1:11 h2:12 h3:13 h4:14 h5:15; do
  mh_host "${h%%:*}" "${h##*:}" || fail "cannot make host ${h%%:*}"
done
REDIS="$(mh_ip 1):6379"
NS=su
DRV="$BIN/ecs-mh-driver"
DEADLINE=1000
mh_bg r "$TMP/redis.log" redis-server --port 6379 --bind "$(mh_ip 1)" --save '' --appendonly no \
  --protected-mode no --daemonize no
mh_wait_tcp r "$(mh_ip 1)" 6379 10 || fail "redis did not start"
for h in h1:11 h2:12 h3:13; do
  mh_bg "${h%%:*}" "$TMP/server-${h%%:*}.log" "$BIN/ecstore-server" --listen "$(mh_ip "${h##*:}"):7700" \
    --unprotected --redis "$REDIS" --ns "$NS" --pool-size 64M --shm-socket off --registry-ttl-ms 10000
  mh_wait_tcp "${h%%:*}" "$(mh_ip "${h##*:}")" 7700 20 || fail "ecstore-server on ${h%%:*} did not start"
done
N=48
out=$(mh_exec h4 timeout 60 "$DRV" put --redis "$REDIS" --ns "$NS" --placement hash --prefix su --n $N \
  --size 16K) || fail "put from h4: $out"
on_h2=$(mh_exec h4 timeout 30 "$DRV" holders --redis "$REDIS" --ns "$NS" --prefix su --n $N |
  grep -c " $(mh_ip 12):7700\$")
[ "$on_h2" -gt 0 ] && [ "$on_h2" -lt $N ] || fail "h2 holds $on_h2 of $N objects"

ip -n "$MH_PFX-sw" link set p12 down || fail "cannot cut h2's link"
# A: keeps reading; its back-off probes of h2 (3 s, then 6 s) renew the mark
mh_bg h4 "$TMP/a.log" "$DRV" rateloop --redis "$REDIS" --ns "$NS" --prefix su --n $N --size 16K \
  --secs 10 --timeout-ms $DEADLINE
A=$MH_PID
for _ in $(seq 50); do
  grep -q "^call .*miss=$on_h2 " "$TMP/a.log" 2>/dev/null && break
  sleep 0.1
done
grep -q "^call .*miss=$on_h2 " "$TMP/a.log" || fail "A never answered h2's items"
# B: a fresh process on another host
mh_exec h5 timeout 60 "$DRV" rateloop --redis "$REDIS" --ns "$NS" --prefix su --n $N --size 16K \
  --secs 4 --timeout-ms $DEADLINE >"$TMP/b.log" 2>&1 || fail "the client on h5 failed"
wait "$A" || fail "the client on h4 failed"
awk '/^call / { print "A " $0; exit }' "$TMP/a.log"
awk -v dl="$DEADLINE" -v h2="$on_h2" '
  /^call / {
    for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    c++
    if (v["dt"] > worst) worst = v["dt"]
    if (c == 1) first = v["dt"]
    if (v["wrong"] != 0 || v["other"] != 0 || v["rc"] != 0 || v["miss"] != h2) { print "bad call: " $0; bad = 1 }
  }
  END {
    printf "B: %d calls, the first %d ms, the slowest %d ms (deadline %d ms); h2 holds %d items\n", c, first, worst, dl, h2
    if (c < 3) { print "too few calls"; bad = 1 }
    if (worst > 300) { print "B waited for h2"; bad = 1 }
    exit bad
  }' "$TMP/b.log" || fail "B did not skip the holder A found cut off"
echo "PASS: B skipped the holder A found cut off"
