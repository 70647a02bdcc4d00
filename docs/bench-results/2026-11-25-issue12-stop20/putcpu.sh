#!/bin/bash
# usage: putcpu.sh tcp|shm SECONDS [server flags]; BIN=a build dir (default /work/main/build),
# PUTLOOP=the putloop binary (from ../2026-11-25-issue12-put/putloop.c:
#   gcc -O2 -Iinclude putloop.c -Lbuild/lib -lecstore -o putloop); STATS=1 also prints what
# Redis ran during the timed run (INFO commandstats: HSET, the delete script's calls)
set -u
TR=$1; SECS=$2; shift 2
B=${BIN:-/work/main/build}/bin; L=${BIN:-/work/main/build}/lib
fp() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
D=$(mktemp -d /tmp/ecs-putcpu.XXXX)
R=$(fp); redis-server --port $R --bind 127.0.0.1 --save "" --appendonly no --dir $D --daemonize no > $D/redis.log 2>&1 & RP=$!
sleep 0.3
P=$(fp); $B/ecstore-server --listen 127.0.0.1:$P --pool-size ${POOL:-256M} --ns test --shm-socket $D/s.sock --log-level warn --redis 127.0.0.1:$R "$@" > $D/srv.log 2>&1 & SP=$!
sleep ${WAIT:-1.5}
TR=$TR LD_LIBRARY_PATH=$L "${PUTLOOP:-./putloop}" 127.0.0.1:$P 1 > /dev/null 2>&1
t() { awk '{print $14+$15}' /proc/$1/stat; }
[ -n "${STATS:-}" ] && redis-cli -p $R CONFIG RESETSTAT >/dev/null
s0=$(t $SP); r0=$(t $RP)
if [ -n "${PERF:-}" ]; then perf record -g -o $PERF -p $SP -- sleep $SECS >/dev/null 2>&1 & PF=$!; fi
out=$( { /usr/bin/time -f "client_ticks %U %S" env TR=$TR LD_LIBRARY_PATH=$L "${PUTLOOP:-./putloop}" 127.0.0.1:$P $SECS; } 2>&1 )
s1=$(t $SP); r1=$(t $RP)
[ -n "${PERF:-}" ] && wait $PF
echo "$TR $* : $out" | tr '\n' ' '; echo " server_ticks $((s1-s0)) redis_ticks $((r1-r0)) load $(cut -d' ' -f1 /proc/loadavg)"
[ -n "${STATS:-}" ] && redis-cli -p $R INFO commandstats | grep -E "cmdstat_(hset|evalsha|eval|set|del|hdel)"
kill $SP; sleep 0.3; kill $RP; wait 2>/dev/null; rm -rf $D
