#!/bin/sh
# ecstore-server in a memory cgroup (a container's limit) smaller than its
# pool, on a host with plenty of memory: refused at start with the cgroup's
# numbers (exit 1), not killed by the cgroup's OOM killer half-way through
# populating.  Root only (it makes a child cgroup of its own, v1 or v2,
# limited to 256 MiB); 77 with the reason elsewhere.
# usage: pool_cgroup.sh BIN_DIR
set -u
bin=${1:?usage: pool_cgroup.sh BIN_DIR}
[ "$(id -u)" = 0 ] || { echo "skip: making a memory cgroup needs root"; exit 77; }
avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
[ "${avail_kb:-0}" -gt $((2 * 1024 * 1024)) ] || { echo "skip: less than 2 GiB available"; exit 77; }
limit=$((256 << 20))
v1=$(sed -n 's/^[0-9]*:memory:\(.*\)$/\1/p' /proc/self/cgroup)
v2=$(sed -n 's/^0::\(.*\)$/\1/p' /proc/self/cgroup)
cg=""
if [ -n "$v1" ] && [ -d "/sys/fs/cgroup/memory$v1" ]; then
  cg="/sys/fs/cgroup/memory${v1%/}/ecs-test-$$"
  mkdir "$cg" 2>/dev/null && echo "$limit" >"$cg/memory.limit_in_bytes" 2>/dev/null ||
    { rmdir "$cg" 2>/dev/null; echo "skip: cannot make a limited cgroup v1 child at $cg"; exit 77; }
elif [ -n "$v2" ] && [ -f "/sys/fs/cgroup${v2%/}/cgroup.subtree_control" ]; then
  cg="/sys/fs/cgroup${v2%/}/ecs-test-$$"
  grep -qw memory "/sys/fs/cgroup${v2%/}/cgroup.subtree_control" ||
    echo +memory >"/sys/fs/cgroup${v2%/}/cgroup.subtree_control" 2>/dev/null
  mkdir "$cg" 2>/dev/null && echo "$limit" >"$cg/memory.max" 2>/dev/null ||
    { rmdir "$cg" 2>/dev/null; echo "skip: cannot make a limited cgroup v2 child at $cg"; exit 77; }
else
  echo "skip: no memory cgroup here"
  exit 77
fi
trap 'rmdir "$cg" 2>/dev/null' EXIT
rc=0
out=$(timeout 120 sh -c 'echo $$ >"$1/cgroup.procs" && exec "$2/ecstore-server" --listen 127.0.0.1:0 --redis none \
  --pool-size 512M --shm-socket off' sh "$cg" "$bin" 2>&1) || rc=$?
echo "$out"
[ "$rc" = 1 ] || { echo "FAIL: exit $rc in a 256 MiB cgroup with a 512 MiB pool; expected 1 (refused)"; exit 1; }
case $out in
  *"cannot start: --pool-size 512 MiB is more than the memory available: "*"left under this cgroup's memory limit of 256 MiB"*"Use a smaller --pool-size"*) ;;
  *) echo "FAIL: no refusal naming the cgroup's limit"; exit 1 ;;
esac
echo "ok: refused with the cgroup's numbers"
