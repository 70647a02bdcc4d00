#!/bin/bash
# shm copy distribution, 10 runs, against a server started as a user would.
B=/work/wt13/build/bin
fp() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
D=$(mktemp -d /tmp/b13shm.XXXX); chmod 700 $D
P=$(fp)
setsid $B/ecstore-server --listen 127.0.0.1:$P --redis none --ns test > $D/server.log 2>&1 & SP=$!
sleep 4
echo "server pid $SP port $P; $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"
$B/ecstore-bench shmcopy --server 127.0.0.1:$P --runs 10
echo "end $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"
kill $SP; wait $SP
tail -5 $D/server.log; rm -rf $D
