#!/bin/bash
# Gets with and without client checksum verification, alternated, one build.
# usage: verify.sh N BIN > out.txt
set -u
N=$1; B=$2
for i in $(seq 1 "$N"); do
  for v in verify no-verify; do
    f=""; [ $v = no-verify ] && f=--no-verify
    echo "== $v run $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    "$B/ecstore-bench" net --sizes 64K --batches 32 --conns 1 --reps 5 --paths tcp $f 2>&1 | grep -E '^get '
    "$B/ecstore-bench" net --sizes 1M,4M,16M --batches 8 --conns 1,2 --reps 3 --paths tcp --no-redis $f 2>&1 |
      grep -E '^get '
  done
done
