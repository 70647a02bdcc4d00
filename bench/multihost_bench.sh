#!/usr/bin/env bash
# Multi-host figures over veth links between network namespaces (issue 14;
# docs/multihost.md), one run, as root:
#   - a cross-host get (1 MiB and 16 MiB objects, batches 1 and 32) from a
#     PD host to the server on an encoder host, as a ratio of a raw TCP read
#     of the same bytes over the same link (ecs-mh-driver rawserve);
#   - the batch's location lookup in Redis (one pipelined round trip), next
#     to the transfer;
#   - a batch spread over two hosts' servers in one call (the groups are
#     fetched in parallel) against its two halves in two calls in a row;
#   - the put cost of replicas 2 against 1 (ratio of medians, same run);
#   - keys moved when a fourth server joins under placement hash (target
#     about 1/N of them).
# Medians with the p10..p90 spread; nothing here is a pass/fail threshold.
#
# usage: bench/multihost_bench.sh BIN_DIR [REPS]
set -u
BIN=${1:?usage: multihost_bench.sh BIN_DIR [REPS]}
REPS=${2:-20}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/netns_hosts.sh
. "$HERE/../tests/netns_hosts.sh"
TMP=$(mktemp -d /tmp/ecs-mhb-XXXXXX)
chmod 0755 "$TMP"
finish() {
  mh_cleanup
  rm -rf "$TMP"
}
trap finish EXIT
trap 'exit 1' INT TERM
die() {
  echo "multihost_bench: $*" >&2
  tail -n 20 "$TMP"/*.log >&2
  exit 1
}

mh_init e8mb
for h in r:1 h1:11 h2:12 h3:13; do
  mh_host "${h%%:*}" "${h##*:}" || die "cannot make host ${h%%:*}"
done
REDIS="$(mh_ip 1):6379"
NS=bench
DRV="$BIN/ecs-mh-driver"
mh_bg r "$TMP/redis.log" redis-server --port 6379 --bind "$(mh_ip 1)" --save '' --appendonly no \
  --protected-mode no --daemonize no
mh_wait_tcp r "$(mh_ip 1)" 6379 10 || die "redis did not start"
server() { # server HOST IDX POOL
  mh_bg "$1" "$TMP/server-$1.log" "$BIN/ecstore-server" --listen "$(mh_ip "$2"):7700" --unprotected \
    --redis "$REDIS" --ns "$NS" --pool-size "$3" --heartbeat-ttl 2 --shm-socket "$TMP/$1.sock"
  mh_wait_tcp "$1" "$(mh_ip "$2")" 7700 30 || die "ecstore-server on $1 did not start"
}
server h1 11 1G
server h2 12 512M
server h3 13 128M
mh_bg h1 "$TMP/raw.log" "$DRV" rawserve --listen "$(mh_ip 11):7800"
mh_wait_tcp h3 "$(mh_ip 11)" 7800 10 || die "raw server did not start"

echo "== cross-host get, PD host h3 <- encoder host h1 (veth), $REPS reps each"
uname -r
for size in 1M 16M; do
  mh_exec h1 "$DRV" put --redis "$REDIS" --ns "$NS" --placement local --prefix "obj$size" --n 32 \
    --size "$size" >/dev/null || die "put $size"
  mh_exec h3 "$DRV" bench --redis "$REDIS" --ns "$NS" --prefix "obj$size" --n 32 --size "$size" \
    --batches 1,32 --reps "$REPS" --raw "$(mh_ip 11):7800" --timeout-ms 60000 || die "bench $size"
done
echo "== the same without the client's checksum check (verify_checksum 0): its share of the get"
for size in 1M 16M; do
  mh_exec h3 "$DRV" bench --redis "$REDIS" --ns "$NS" --prefix "obj$size" --n 32 --size "$size" \
    --batches 32 --reps "$REPS" --raw "$(mh_ip 11):7800" --timeout-ms 60000 --verify 0 || die "bench $size"
done

echo "== a batch over two hosts' servers: one call (groups fetched in parallel) vs. two calls in a row"
for size in 1M 16M; do
  mh_exec h2 "$DRV" put --redis "$REDIS" --ns "$NS" --placement local --prefix "h2obj$size" --n 16 \
    --size "$size" >/dev/null || die "put $size on h2"
  mh_exec h3 "$DRV" spread --redis "$REDIS" --ns "$NS" --prefix "obj$size" --prefix2 "h2obj$size" --n 32 \
    --size "$size" --reps "$REPS" --timeout-ms 60000 || die "spread $size"
done

echo "== put cost of replicas 2 vs 1, PD host h3 -> servers on h1, h2, h3 (fresh objects, alternating)"
# shellcheck disable=SC2086
for cell in "16 1M" "4 16M"; do
  set -- $cell # two words: count and size
  mh_exec h3 "$DRV" putbench --redis "$REDIS" --ns "$NS" --prefix "pb$2" --n "$1" --size "$2" --reps "$REPS" \
    --replicas 2 --timeout-ms 60000 || die "putbench $2"
done

echo "== keys moved when a 4th server joins (placement hash, 400 keys)"
mh_exec h3 "$DRV" put --redis "$REDIS" --ns "$NS" --placement hash --prefix mv --n 400 --size 4K >/dev/null ||
  die "hash puts"
mh_exec h3 "$DRV" holders --redis "$REDIS" --ns "$NS" --prefix mv --n 400 >"$TMP/before"
mh_host h4 14 || die "cannot make host h4"
server h4 14 128M
sleep 1 # the drivers read the registry at connect; this is for the heartbeat's free bytes only
mh_exec h3 "$DRV" put --redis "$REDIS" --ns "$NS" --placement hash --prefix mv --n 400 --size 4K >/dev/null ||
  die "hash puts after the join"
mh_exec h3 "$DRV" holders --redis "$REDIS" --ns "$NS" --prefix mv --n 400 >"$TMP/after"
paste -d' ' "$TMP/before" "$TMP/after" | awk -v new="$(mh_ip 14):7700" '
  { if ($2 != $4) { moved++; if ($4 != new) elsewhere++ } }
  END { printf "moved %d of %d keys (1/N = %d); moved between the old servers: %d\n", moved, NR, NR / 4, elsewhere }'
