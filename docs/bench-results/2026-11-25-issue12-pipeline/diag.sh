#!/bin/bash
set -u
B=${B:-/tmp/h1-final/bin}
fp() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
D=$(mktemp -d /tmp/h1-bench/diag.XXXX)
R=$(fp); redis-server --port $R --bind 127.0.0.1 --save "" --appendonly no --dir $D --daemonize no > $D/redis.log 2>&1 & RP=$!
sleep 0.5
P=$(fp); setsid $B/ecstore-server --listen 127.0.0.1:$P --pool-size 1024M --ns test --shm-socket $D/s.sock --log-level warn --redis 127.0.0.1:$R "$@" > $D/srv.log 2>&1 & SP=$!
sleep 3
redis-cli -p $R CONFIG RESETSTAT > /dev/null
c0=$(awk '{print $14+$15}' /proc/$SP/stat); r0=$(awk '{print $14+$15}' /proc/$RP/stat)
$B/ecstore-bench net --server 127.0.0.1:$P --no-redis --sizes 64K --batches 32 --conns 1 --reps 5 --paths tcp 2>&1 | grep '^put'
c1=$(awk '{print $14+$15}' /proc/$SP/stat); r1=$(awk '{print $14+$15}' /proc/$RP/stat)
echo "server cpu ticks $((c1-c0)) redis cpu ticks $((r1-r0))"
redis-cli -p $R INFO commandstats | grep -E "hset|evalsha|eval:|cmdstat_del"
kill $SP; sleep 1; kill $RP; wait; rm -rf $D
