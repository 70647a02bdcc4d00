#!/bin/bash
while pgrep -f "b13/pairs.sh i13" >/dev/null; do sleep 2; done
/tmp/b13/pairs.sh i12b 8 -- --sizes 64K --batches 32 --conns 1 --reps 3 --seconds 0.3 > /tmp/b13/i12b.out 2>&1
/tmp/b13/diag.sh 6 > /tmp/b13/diag.out 2>&1
/tmp/b13/shmcopy.sh > /tmp/b13/shmcopy.out 2>&1
OLD=/tmp/pre13-ecstore/build/bin/ecstore-bench NEW=/tmp/old-ecstore/build/bin/ecstore-bench /tmp/b13/pairs.sh pre13 8 -- --sizes 1M,4M,16M --batches 1,8 --conns 1 --reps 3 --seconds 0.2 --no-redis > /tmp/b13/pre13.out 2>&1
