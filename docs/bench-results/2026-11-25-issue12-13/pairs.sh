#!/bin/bash
# usage: pairs.sh TAG NREPS -- bench-net-args...
# Runs OLD and NEW ecstore-bench net back to back per repetition, alternating
# which goes first (odd reps: old first, even reps: new first).  Each bench
# starts its own redis-server and its own ecstore-server (from its build).
set -u
TAG=$1; N=$2; shift 3
OLD=${OLD:-/tmp/old-ecstore/build/bin/ecstore-bench}
NEW=${NEW:-/work/wt13/build/bin/ecstore-bench}
OUT=/tmp/b13/$TAG; mkdir -p $OUT
unset ECS_BIN_DIR
for i in $(seq 1 $N); do
  if [ $((i % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    bin=$OLD; [ $v = new ] && bin=$NEW
    la0=$(cut -d' ' -f1-3 /proc/loadavg); t0=$(date -u +%H:%M:%S)
    $bin net "$@" --csv $OUT/$v-$i.csv > $OUT/$v-$i.txt 2>&1; rc=$?
    la1=$(cut -d' ' -f1-3 /proc/loadavg); t1=$(date -u +%H:%M:%S)
    echo "$i $v $t0 $t1 rc=$rc load_before=[$la0] load_after=[$la1]" | tee -a $OUT/log
  done
done
