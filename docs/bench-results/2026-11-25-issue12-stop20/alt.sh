#!/bin/bash
# Alternates two builds' own `ecstore-bench net` (each starts its own Redis
# and ecstore-server) N times: 64 KiB x 32, one connection, tcp and shm.
# usage: alt.sh N OLD_BIN NEW_BIN [extra bench flags] > out.txt
set -u
N=$1; OLD=$2; NEW=$3; shift 3
for i in $(seq 1 "$N"); do
  for tag in old new; do
    B=$OLD; [ $tag = new ] && B=$NEW
    echo "== $tag run $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    "$B/ecstore-bench" net --sizes 64K --batches 32 --conns 1 --reps 5 "$@" 2>&1 |
      grep -E '^(get|put) |^ +64K'
  done
done
