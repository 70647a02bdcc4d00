#!/bin/bash
# Alternates ecstore-bench net (64K x 32, 1 conn, tcp) against three hand-started
# servers of the same build: default (--threads = cores, Redis records),
# --threads 1 (Redis records), --redis none.  Kills only the PIDs it started.
set -u
B=/work/wt15/build/bin; OUT=${OUT:-/tmp/h15/abc}; mkdir -p $OUT
fp() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
D=$(mktemp -d /tmp/h15/abc.XXXX); chmod 700 $D
R=$(fp); redis-server --port $R --bind 127.0.0.1 --save "" --appendonly no --dir $D --daemonize no > $D/redis.log 2>&1 & RP=$!
sleep 0.5
start() { local p=$(fp); mkdir $D/$1; shift; setsid $B/ecstore-server --listen 127.0.0.1:$p --pool-size 1024M --ns test --shm-socket $D/$p.sock --log-level warn "$@" > $D/$p.log 2>&1 & echo "$p $!"; }
read PA SA < <(start a --redis 127.0.0.1:$R)
read PB SB < <(start b --redis 127.0.0.1:$R --threads 1)
read PC SC < <(start c --redis none)
sleep 3
for i in $(seq 1 ${1:-5}); do
  case $((i % 3)) in 1) order="def t1 none";; 2) order="t1 none def";; 0) order="none def t1";; esac
  for v in $order; do
    case $v in def) p=$PA;; t1) p=$PB;; none) p=$PC;; esac
    la0=$(cut -d' ' -f1 /proc/loadavg); t0=$(date -u +%H:%M:%S)
    $B/ecstore-bench net --server 127.0.0.1:$p --redis 127.0.0.1:$R --sizes 64K --batches 32 --conns 1 --reps 3 --seconds 0.3 --paths tcp --csv $OUT/$v-$i.csv > $OUT/$v-$i.txt 2>&1; rc=$?
    echo "$i $v $t0 rc=$rc load_before=[$la0] load_after=[$(cut -d' ' -f1 /proc/loadavg)]" | tee -a $OUT/log
  done
done
kill $SA $SB $SC; sleep 1; kill $RP; wait; rm -rf $D
