#!/bin/bash
# alternate old and new builds: N rounds of the issue-12 command each
N=${1:-6}; OUT=${2:-/tmp/h2-ab.txt}; NEW=${3:-/work/wt2/build/bin}
: > $OUT
for i in $(seq 1 $N); do
  for b in /tmp/h2-old/bin $NEW; do
    la=$(cut -d' ' -f1 /proc/loadavg)
    line=$($b/ecstore-bench net --sizes 64K --batches 32 --conns 1 --reps 5 --paths tcp 2>&1 | grep "^get")
    echo "$b load=$la $line" >> $OUT
  done
done
