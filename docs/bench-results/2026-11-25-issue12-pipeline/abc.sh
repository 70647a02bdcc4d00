#!/bin/bash
# Alternates ecstore-bench net (64K x 32, 1 conn, tcp) against three hand-started
# servers on one Redis: main (old server, old client), this branch (new server,
# new client), this branch with --redis none (new client).  Kills only its PIDs.
set -u
OLD=/tmp/h1-old/bin; NEW=/tmp/h1-final/bin; OUT=${OUT:-/tmp/h1-bench/abc}; mkdir -p $OUT
fp() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
D=$(mktemp -d /tmp/h1-bench/abc.XXXX); chmod 700 $D
R=$(fp); redis-server --port $R --bind 127.0.0.1 --save "" --appendonly no --dir $D --daemonize no > $D/redis.log 2>&1 & RP=$!
sleep 0.5
start() { local b=$1; shift; local p=$(fp); setsid $b/ecstore-server --listen 127.0.0.1:$p --pool-size 1024M --ns test --shm-socket $D/$p.sock --log-level warn "$@" > $D/$p.log 2>&1 & echo "$p $!"; }
read PA SA < <(start $OLD --redis 127.0.0.1:$R)
read PB SB < <(start $NEW --redis 127.0.0.1:$R)
read PC SC < <(start $NEW --redis none)
sleep 3
for i in $(seq 1 ${1:-5}); do
  case $((i % 3)) in 1) order="old new none";; 2) order="new none old";; 0) order="none old new";; esac
  for v in $order; do
    case $v in old) p=$PA; b=$OLD;; new) p=$PB; b=$NEW;; none) p=$PC; b=$NEW;; esac
    la0=$(cut -d' ' -f1 /proc/loadavg); t0=$(date -u +%H:%M:%S)
    $b/ecstore-bench net --server 127.0.0.1:$p --redis 127.0.0.1:$R --sizes 64K --batches 32 --conns 1 --reps 5 --paths tcp > $OUT/$v-$i.txt 2>&1; rc=$?
    echo "$i $v $t0 rc=$rc load=[$la0] $(grep '^put ' $OUT/$v-$i.txt)" | tee -a $OUT/log
  done
done
kill $SA $SB $SC; sleep 1; kill $RP; wait; rm -rf $D
