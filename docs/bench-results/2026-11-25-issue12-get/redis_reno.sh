#!/bin/bash
RP=$(cat /tmp/h2prof/rr.port); OUT=/tmp/h2-redisreno.txt; : > $OUT
for i in 1 2 3 4 5; do
  la=$(cut -d' ' -f1 /proc/loadavg)
  echo "bbr-redis load=$la $(/tmp/h2-new1-bin/ecstore-bench net --sizes 64K --batches 32 --conns 1 --reps 5 --paths tcp 2>&1 | grep '^get')" >> $OUT
  la=$(cut -d' ' -f1 /proc/loadavg)
  echo "reno-redis load=$la $(/tmp/h2-new1-bin/ecstore-bench net --sizes 64K --batches 32 --conns 1 --reps 5 --paths tcp --redis 127.0.0.1:$RP 2>&1 | grep '^get')" >> $OUT
done
