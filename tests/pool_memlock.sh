#!/bin/sh
# A pool over RLIMIT_MEMLOCK, without CAP_IPC_LOCK: ecstore-server says so
# with the numbers before it populates (the library's own "mlock ...
# refused" line comes only after populating), then runs unpinned.  Needs
# util-linux's prlimit and setpriv (77 without).
# usage: pool_memlock.sh BIN_DIR
set -u
bin=${1:?usage: pool_memlock.sh BIN_DIR}
command -v prlimit >/dev/null && command -v setpriv >/dev/null ||
  { echo "skip: needs prlimit and setpriv (util-linux)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
setpriv --bounding-set -ipc_lock --inh-caps -ipc_lock true 2>/dev/null ||
  { echo "skip: setpriv cannot drop CAP_IPC_LOCK here"; exit 77; }
prlimit --memlock=65536 setpriv --bounding-set -ipc_lock --inh-caps -ipc_lock \
  "$bin/ecstore-server" --listen 127.0.0.1:0 --redis none --pool-size 8M --shm-socket off >"$tmp/log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "ready:" "$tmp/log" && break; sleep 0.1; done
kill "$pid" 2>/dev/null
wait "$pid"
cat "$tmp/log"
early=$(grep -n "pool: 8 MiB is over RLIMIT_MEMLOCK (64 KiB) and this process lacks CAP_IPC_LOCK: the pool will not be pinned" "$tmp/log" | cut -d: -f1)
late=$(grep -n "mlock of the 8388608-byte pool refused" "$tmp/log" | cut -d: -f1)
[ -n "$early" ] || { echo "FAIL: no early RLIMIT_MEMLOCK line"; exit 1; }
[ -n "$late" ] && [ "$early" -lt "$late" ] || { echo "FAIL: the early line is not before the pool's own warning"; exit 1; }
grep -q "pool 8 MiB (NOT pinned)" "$tmp/log" || { echo "FAIL: the server did not run unpinned"; exit 1; }
echo "ok: said before populating, then ran unpinned"
