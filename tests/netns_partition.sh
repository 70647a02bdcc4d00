#!/usr/bin/env bash
# A partition costs one deadline, not one per call (issue 24): three
# servers on h1..h3, a client on h4 reading batches that span all three
# (placement hash), back to back, with a 500 ms deadline.  h2's link goes
# down mid-run (its switch port, so h2 keeps running and stays in the
# registry until its TTL, 10 s, runs out: a cut, not a crash).  From one
# deadline after the cut, the items answered per second (hits, and clean
# misses for h2's objects) stay at least half the rate before it, and no
# call overruns its deadline by more than 50 ms.  Network namespaces, as
# root (exit 77 elsewhere).
#
# usage: netns_partition.sh BIN_DIR
set -u
BIN=${1:?usage: netns_partition.sh BIN_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/netns_hosts.sh
. "$HERE/netns_hosts.sh"
command -v redis-server >/dev/null || { echo "skip: no redis-server" >&2; exit 77; }

mh_tmp pt

mh_init e8pt
for h in r:1 h1:11 h2:12 h3:13 h4:14; do
  mh_host "${h%%:*}" "${h##*:}" || fail "cannot make host ${h%%:*}"
done
REDIS="$(mh_ip 1):6379"
NS=pt
DRV="$BIN/ecs-mh-driver"
DEADLINE=500
mh_bg r "$TMP/redis.log" redis-server --port 6379 --bind "$(mh_ip 1)" --save '' --appendonly no \
  --protected-mode no --daemonize no
mh_wait_tcp r "$(mh_ip 1)" 6379 10 || fail "redis did not start"
for h in h1:11 h2:12 h3:13; do
  mh_bg "${h%%:*}" "$TMP/server-${h%%:*}.log" "$BIN/ecstore-server" --listen "$(mh_ip "${h##*:}"):7700" \
    --unprotected --redis "$REDIS" --ns "$NS" --pool-size 64M --shm-socket off --heartbeat-ttl 10
  mh_wait_tcp "${h%%:*}" "$(mh_ip "${h##*:}")" 7700 20 || fail "ecstore-server on ${h%%:*} did not start"
done
N=48
out=$(mh_exec h4 timeout 60 "$DRV" put --redis "$REDIS" --ns "$NS" --placement hash --prefix pt --n $N \
  --size 16K) || fail "put from h4: $out"
on_h2=$(mh_exec h4 timeout 30 "$DRV" holders --redis "$REDIS" --ns "$NS" --prefix pt --n $N |
  grep -c " $(mh_ip 12):7700\$")
[ "$on_h2" -gt 0 ] && [ "$on_h2" -lt $N ] || fail "h2 holds $on_h2 of $N objects"

mh_bg h4 "$TMP/calls.log" "$DRV" rateloop --redis "$REDIS" --ns "$NS" --prefix pt --n $N --size 16K \
  --secs 9 --timeout-ms $DEADLINE
LOOP=$MH_PID
sleep 3
cut=$(date +%s%3N)
ip -n "$MH_PFX-sw" link set p12 down || fail "cannot cut h2's link"
wait "$LOOP" || fail "the client on h4 failed"
echo "h2 (holding $on_h2 of $N objects) cut off at $cut"
awk -v cut="$cut" -v dl="$DEADLINE" -v n="$N" -v h2="$on_h2" '
  /^call / {
    for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    t = v["wall"]; e = t + v["dt"]; got = v["ok"] + v["miss"]
    if (v["wrong"] != 0 || v["other"] != 0 || v["rc"] != 0) { print "bad call: " $0; bad = 1 }
    if (v["dt"] - dl > over) over = v["dt"] - dl
    if (e <= cut) { if (!b0) b0 = t; b1 = e; bn += got; bc++ }
    else if (t >= cut + dl) { if (!a0) a0 = t; a1 = e; an += got; ac++; if (v["miss"] > h2) { print "extra misses: " $0; bad = 1 } }
  }
  END {
    rb = bn / ((b1 - b0) / 1000); ra = an / ((a1 - a0) / 1000)
    printf "before the cut: %d calls, %.0f items/s; from one deadline after: %d calls, %.0f items/s (%.0f%%); worst overrun %d ms\n", bc, rb, ac, ra, 100 * ra / rb, over
    if (bc < 3 || ac < 3) { print "too few calls to compare"; bad = 1 }
    if (ra < rb / 2) { print "the rate fell below half"; bad = 1 }
    if (over > 50) { print "a call overran its deadline by more than 50 ms"; bad = 1 }
    exit bad
  }' "$TMP/calls.log" || fail "the partition cost more than one deadline"
echo "PASS: a partition costs one deadline"
