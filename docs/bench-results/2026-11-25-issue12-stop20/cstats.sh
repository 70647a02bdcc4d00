#!/bin/bash
# usage: cstats.sh tcp|shm SECONDS [server flags]: one putloop run, then Redis INFO commandstats
set -u
TR=$1; SECS=$2; shift 2
B=${BIN:-/work/main/build}/bin; L=${BIN:-/work/main/build}/lib
fp() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
D=$(mktemp -d /tmp/ecs-cstats.XXXX)
R=$(fp); redis-server --port $R --bind 127.0.0.1 --save "" --appendonly no --dir $D --daemonize no > $D/redis.log 2>&1 & RP=$!
sleep 0.3
P=$(fp); $B/ecstore-server --listen 127.0.0.1:$P --pool-size ${POOL:-256M} --ns test --shm-socket $D/s.sock --log-level warn --redis 127.0.0.1:$R "$@" > $D/srv.log 2>&1 & SP=$!
sleep 1.5
TR=$TR LD_LIBRARY_PATH=$L "${PUTLOOP:-./putloop}" 127.0.0.1:$P 1 > /dev/null 2>&1
redis-cli -p $R CONFIG RESETSTAT >/dev/null
TR=$TR LD_LIBRARY_PATH=$L "${PUTLOOP:-./putloop}" 127.0.0.1:$P $SECS
redis-cli -p $R INFO commandstats | grep -E "cmdstat_(hset|evalsha|eval|set|del|hdel)"
kill $SP; sleep 0.3; kill $RP; wait 2>/dev/null; rm -rf $D
