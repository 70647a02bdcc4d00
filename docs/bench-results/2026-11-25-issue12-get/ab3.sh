#!/bin/bash
OUT=/tmp/h2-ab3.txt; : > $OUT
for i in 1 2 3 4; do
  for b in /tmp/h2-old/bin /tmp/h2-new2-bin; do
    la=$(cut -d' ' -f1 /proc/loadavg)
    $b/ecstore-bench net --sizes 64K,1M --batches 32 --conns 1 --reps 5 --paths tcp 2>&1 | grep -E "^(get|put)" | sed "s|^|$b load=$la |" >> $OUT
  done
done
