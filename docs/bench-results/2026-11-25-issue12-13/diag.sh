#!/bin/bash
# Puts of 64 KiB x 32 against two hand-started new servers, one with Redis
# records (group commit), one with --redis none, alternating; same Redis for
# the bench's SET/GET baseline.  Kills only the PIDs it started.
set -u
B=/work/wt13/build/bin
OUT=/tmp/b13/diag; mkdir -p $OUT
fp() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
D=$(mktemp -d /tmp/b13diag.XXXX); chmod 700 $D
R=$(fp); redis-server --port $R --bind 127.0.0.1 --save "" --appendonly no --dir $D --daemonize no > $D/redis.log 2>&1 & RP=$!
sleep 0.5
PA=$(fp); mkdir $D/a; setsid $B/ecstore-server --listen 127.0.0.1:$PA --redis 127.0.0.1:$R --pool-size 1024M --ns test --shm-socket $D/a/shm.sock --log-level warn > $D/a.log 2>&1 & SA=$!
PB=$(fp); mkdir $D/b; setsid $B/ecstore-server --listen 127.0.0.1:$PB --redis none --pool-size 1024M --ns test --shm-socket $D/b/shm.sock --log-level warn > $D/b.log 2>&1 & SB=$!
sleep 3
for i in $(seq 1 ${1:-6}); do
  if [ $((i % 2)) -eq 1 ]; then order="redis none"; else order="none redis"; fi
  for v in $order; do
    p=$PA; [ $v = none ] && p=$PB
    la0=$(cut -d' ' -f1 /proc/loadavg); t0=$(date -u +%H:%M:%S)
    $B/ecstore-bench net --server 127.0.0.1:$p --redis 127.0.0.1:$R --sizes 64K --batches 32 --conns 1 --reps 3 --seconds 0.3 --csv $OUT/$v-$i.csv > $OUT/$v-$i.txt 2>&1; rc=$?
    echo "$i $v $t0 rc=$rc load_before=[$la0] load_after=[$(cut -d' ' -f1 /proc/loadavg)]" | tee -a $OUT/log
  done
done
kill $SA $SB; sleep 1; kill $RP; wait
cat $D/a.log $D/b.log | tail -5; rm -rf $D
