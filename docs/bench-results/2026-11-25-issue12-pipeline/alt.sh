#!/bin/sh
# alt.sh N OUT OLD_BIN NEW_BIN: alternate old/new ecstore-bench net runs
N=$1; OUT=$2; OLD=$3; NEW=$4
: > $OUT
for i in $(seq 1 $N); do
  for which in old new; do
    if [ $which = old ]; then B=$OLD; else B=$NEW; fi
    load=$(cut -d' ' -f1 /proc/loadavg)
    line=$(ECS_BIN_DIR=$B $B/ecstore-bench net --sizes 64K --batches 32 --conns 1 --reps 5 --paths tcp 2>&1 | grep '^put ')
    echo "$which $i load=$load $(date -u +%H:%M:%S) | $line" >> $OUT
  done
done
