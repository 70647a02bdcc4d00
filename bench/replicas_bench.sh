#!/usr/bin/env bash
# What replicas cost a put (issue 14; docs/multihost.md "Replicas"), on
# loopback, no root needed: Redis and three ecstore-servers started here
# on free ports in a temp dir, servers found through the registry.  For
# each object size, put batches of fresh objects with replicas 1 and with
# replicas 2 alternate rep by rep (ecs-mh-driver putbench), and the ratio
# of the medians is printed with each one's p10..p90 spread.  Nothing here
# is a pass/fail threshold.
#
# usage: bench/replicas_bench.sh BIN_DIR [REPS] [TRANSPORT]
set -u
BIN=${1:?usage: replicas_bench.sh BIN_DIR [REPS] [TRANSPORT]}
REPS=${2:-15}
TRANSPORT=${3:-tcp}
TMP=$(mktemp -d /tmp/ecs-repb-XXXXXX)
PIDS=()
finish() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap finish EXIT
trap 'exit 1' INT TERM
die() {
  echo "replicas_bench: $*" >&2
  tail -n 20 "$TMP"/*.log >&2
  exit 1
}
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_port() { # wait_port PORT
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

RP=$(free_port)
(cd "$TMP" && exec redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  >"$TMP/redis.log" 2>&1) &
PIDS+=($!)
wait_port "$RP" || die "redis did not start"
for i in 1 2 3; do
  p=$(free_port)
  "$BIN/ecstore-server" --listen "127.0.0.1:$p" --redis "127.0.0.1:$RP" --ns bench --pool-size 1G \
    --shm-socket "$TMP/s$i.sock" --log-level warn >"$TMP/server$i.log" 2>&1 &
  PIDS+=($!)
  wait_port "$p" || die "server $i did not start"
done
sleep 0.5 # the registry entries are written once each server is up
echo "== put cost of replicas 2 vs 1: 3 servers on loopback, transport $TRANSPORT, $REPS reps, $(nproc) cores"
uname -r
cat /proc/loadavg
# shellcheck disable=SC2086
for cell in "64 64K" "32 1M" "8 16M"; do
  set -- $cell # two words: count and size
  "$BIN/ecs-mh-driver" putbench --redis "127.0.0.1:$RP" --ns bench --prefix "pb$2" --n "$1" --size "$2" \
    --reps "$REPS" --replicas 2 --transport "$TRANSPORT" --timeout-ms 60000 || die "putbench $2"
done
cat /proc/loadavg
