#!/usr/bin/env bash
# The device bundle (scripts/device-check.sh --bundle) runs with nothing but
# its own libraries and glibc: a chroot holding only the bundle, glibc's
# loader, libc and libm, and /bin/sh (for the redis-server wrapper).  In it:
#   - ecstore-server and redis-server fail to load without the bundle's lib
#     dirs (so no other copy of hiredis, libssl, ... can be reached), and
#     ecstore-server --help runs with them;
#   - redis-server and ecstore-server start, the server registers in that
#     Redis, and the bundle's ecstore-cli (also in the chroot) puts and gets
#     a file; the cli built here reads the same object from outside and
#     sees the Redis link up.
# Root only (chroot); exit 77 with the reason elsewhere.
#
# usage: tests/device_bundle_chroot.sh BUILD_DIR
set -u
BUILD=${1:?usage: device_bundle_chroot.sh BUILD_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || {
  echo "skip: chroot needs root"
  exit 77
}
if ldd "$BUILD/bin/ecstore-server" | grep -q -E 'lib(asan|tsan|ubsan)'; then
  echo "skip: a sanitizer build (its runtime needs /proc, which the bare chroot has not)"
  exit 77
fi
T=$(mktemp -d /tmp/ecs-chroot-XXXXXX)
R=$T/root
PIDS=()
finish() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap finish EXIT
fail() {
  echo "FAIL: $*"
  for f in "$T"/*.log; do
    [ -f "$f" ] && echo "--- $f" && tail -n 20 "$f"
  done
  exit 1
}

out=$(ECS_DEVICE_BUNDLE=$T/bundle ECS_DEVICE_BUILD=$BUILD timeout 120 "$SRC/scripts/device-check.sh" --bundle --no-build 2>&1) ||
  fail "bundle: $out"
echo "$out" | grep -qx "bundle: $T/bundle" || fail "no 'bundle: DIR' line: $out"

mkdir -p "$R/lib/x86_64-linux-gnu" "$R/lib64" "$R/bin" "$R/tmp" || fail mkdir
cp -a "$T/bundle" "$R/b" || fail "copy bundle"
cp /bin/dash "$R/bin/sh" 2>/dev/null || cp /bin/sh "$R/bin/sh" || fail "no /bin/sh"
# glibc: exactly the loader, libc and libm that the bundle's files name
for f in "$R"/b/bin/ecstore-* "$R"/b/bin/ecs-* "$R"/b/libexec/redis-server "$R/bin/sh"; do
  ldd "$f" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }'
done | sort -u | while read -r lib; do
  case ${lib##*/} in
  ld-linux*) cp -L "$lib" "$R/lib64/${lib##*/}" ;;
  libc.so.6 | libm.so.6) cp -L "$lib" "$R/lib/x86_64-linux-gnu/${lib##*/}" ;;
  esac
done
chroot "$R" /bin/sh -c true 2>/dev/null || {
  echo "skip: chroot into $R refused here"
  exit 77
}
echo "chroot holds: $(cd "$R" && find . -type f -path './lib*' | sort | tr '\n' ' ')"
CHROOT=$(command -v chroot)
in_root() { timeout 30 env -i "$CHROOT" "$R" /bin/sh -c "$1"; }

# without the bundle's lib dir nothing else provides the libraries
if in_root 'exec /b/bin/ecstore-server --help' >"$T/nolib.log" 2>&1; then
  fail "ecstore-server ran without the bundle's libraries: the chroot is not bare"
fi
grep -q "error while loading shared libraries" "$T/nolib.log" || fail "unexpected failure: $(cat "$T/nolib.log")"
echo "without LD_LIBRARY_PATH: $(head -n 1 "$T/nolib.log")"
in_root 'exec /b/libexec/redis-server --version' >"$T/nolib-redis.log" 2>&1 &&
  fail "redis-server ran without the bundle's libraries: the chroot is not bare"
grep -q "error while loading shared libraries" "$T/nolib-redis.log" || fail "unexpected: $(cat "$T/nolib-redis.log")"
in_root 'LD_LIBRARY_PATH=/b/lib exec /b/bin/ecstore-server --help' >/dev/null 2>&1 ||
  fail "ecstore-server --help does not run in the chroot"

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_port() {
  local _
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
RP=$(free_port)
env -i "$CHROOT" "$R" /b/bin/redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  --dir /tmp >"$T/redis.log" 2>&1 &
PIDS+=($!)
wait_port "$RP" $! || fail "redis-server did not start in the chroot"
SP=$(free_port)
env -i "$CHROOT" "$R" /bin/sh -c "LD_LIBRARY_PATH=/b/lib exec /b/bin/ecstore-server --listen 127.0.0.1:$SP \
  --unprotected --redis 127.0.0.1:$RP --ns bundle --pool-size 64M --no-mlock --shm-socket /tmp/s.sock" \
  >"$T/server.log" 2>&1 &
PIDS+=($!)
wait_port "$SP" $! || fail "ecstore-server did not start in the chroot"

head -c 300000 /dev/urandom >"$R/tmp/in" || fail urandom
cli="LD_LIBRARY_PATH=/b/lib /b/bin/ecstore-cli --server 127.0.0.1:$SP --ns bundle"
in_root "$cli put k1 /tmp/in && $cli get k1 /tmp/back" >"$T/cli.log" 2>&1 || fail "cli in the chroot: $(cat "$T/cli.log")"
cmp "$R/tmp/in" "$R/tmp/back" || fail "the bytes came back different"
timeout 20 "$BUILD/bin/ecstore-cli" --server "127.0.0.1:$SP" --ns bundle get k1 "$T/outside" >>"$T/cli.log" 2>&1 ||
  fail "get from outside"
cmp "$R/tmp/in" "$T/outside" || fail "the bytes read from outside differ"
st=$(timeout 20 "$BUILD/bin/ecstore-cli" --server "127.0.0.1:$SP" --ns bundle stat 2>&1) || fail "stat: $st"
echo "$st" | grep -q "redis up" || fail "the server's Redis link is not up: $st"
echo "ok: redis-server and ecstore-server ran in a chroot of the bundle and glibc only; put/get of 300000 bytes identical"
