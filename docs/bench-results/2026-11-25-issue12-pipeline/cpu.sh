#!/bin/bash
# CPU per 32 x 64 KiB put call: client (putloop), server, Redis; records vs --redis none.
# usage: cpu.sh BIN_DIR LIB_DIR [server flags]; kills only its PIDs.
set -u
B=$1; L=$2; shift 2
fp() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
D=$(mktemp -d /tmp/h1-bench/cpu.XXXX)
R=$(fp); redis-server --port $R --bind 127.0.0.1 --save "" --appendonly no --dir $D --daemonize no > $D/redis.log 2>&1 & RP=$!
sleep 0.5
P=$(fp); setsid $B/ecstore-server --listen 127.0.0.1:$P --pool-size 256M --ns test --shm-socket $D/s.sock --log-level warn --redis 127.0.0.1:$R "$@" > $D/srv.log 2>&1 & SP=$!
sleep 2
LD_LIBRARY_PATH=$L /tmp/h1-bench/putloop 127.0.0.1:$P 1 > /dev/null 2>&1   # warm: fill the pool
t() { awk '{print $14+$15}' /proc/$1/stat; }
s0=$(t $SP); r0=$(t $RP)
out=$( { /usr/bin/time -f "client_ticks_s %U %S" env LD_LIBRARY_PATH=$L /tmp/h1-bench/putloop 127.0.0.1:$P 3; } 2>&1 )
s1=$(t $SP); r1=$(t $RP)
echo "$out" | tr '\n' ' '; echo " server_ticks $((s1-s0)) redis_ticks $((r1-r0)) load $(cut -d' ' -f1 /proc/loadavg)"
kill $SP; sleep 0.5; kill $RP; wait; rm -rf $D
