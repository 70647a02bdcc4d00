#!/bin/bash
while pgrep -f "b13/chain.sh" >/dev/null; do sleep 2; done
/tmp/b13/pairs.sh i12c4 6 -- --sizes 64K --batches 32 --conns 4 --reps 3 --seconds 0.3 > /tmp/b13/i12c4.out 2>&1
