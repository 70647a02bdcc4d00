#!/usr/bin/env bash
# README's "Using it" block, run as written: taken from README.md between
# its using-it:begin / using-it:end markers, with only its ports (6380,
# 7700) changed to free ones, in a temp dir where build/ points at this
# build.  Every command must succeed, the object must come back byte for
# byte, and nothing it started is left running.  Pasted into a shell, the
# block once failed: the put ran while the 4 GiB pool was still being
# populated (connection refused).
# usage: readme_using_it.sh SRC_DIR BIN_DIR
set -u
src=${1:?usage: readme_using_it.sh SRC_DIR BIN_DIR}
bin=$(cd "${2:?usage: readme_using_it.sh SRC_DIR BIN_DIR}" && pwd)
command -v redis-server >/dev/null || { echo "skip: no redis-server"; exit 77; }
command -v redis-cli >/dev/null || { echo "skip: no redis-cli (redis-tools), needed to stop the block's Redis"; exit 77; }
avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
if [ "${avail_kb:-0}" -lt $((6 * 1024 * 1024)) ]; then
  echo "skip: the block's 4G pool needs 4 GiB and this host has $((avail_kb / 1024)) MiB available (MemAvailable)"
  exit 77
fi

block=$(awk '/<!-- using-it:begin/ { on = 1; next } /<!-- using-it:end/ { on = 0 } on' "$src/README.md" | grep -v '^```')
[ -n "$block" ] || { echo "FAIL: no using-it block in README.md"; exit 1; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
rp=$(free_port)
sp=$(free_port)
while [ "$sp" = "$rp" ]; do sp=$(free_port); done
tmp=$(mktemp -d /tmp/ecs-readme-XXXXXX)
ln -s "$(dirname "$bin")" "$tmp/build"
# The block, ports changed; the trap notes the server's pid ($! of the
# block's '&') whatever happens, so that it can be stopped.
{
  echo 'trap '\''echo "$!" >server.pid'\'' EXIT'
  echo "$block" | sed -e "s/\\b6380\\b/$rp/g" -e "s/\\b7700\\b/$sp/g"
} >"$tmp/block.sh"
cleanup() {
  if [ -s "$tmp/server.pid" ]; then
    pid=$(cat "$tmp/server.pid")
    kill "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  fi
  redis-cli -p "$rp" shutdown nosave >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
echo "--- the block (Redis on $rp, the server on $sp), in $tmp:"
cat "$tmp/block.sh"
echo "---"
# Into a file, not $(...): the block's server, left running in the
# background, would hold a pipe open until it stops.
rc=0
(cd "$tmp" && env -u ECSTORE_SERVERS -u ECSTORE_REDIS -u ECSTORE_NS timeout 120 bash -e "$tmp/block.sh" \
  >"$tmp/out.log" 2>&1) || rc=$?
out=$(cat "$tmp/out.log")
echo "$out"
[ "$rc" = 0 ] || { echo "FAIL: the block exited $rc"; exit 1; }
want() { case $out in *"$1"*) ;; *) echo "FAIL: the output lacks '$1'"; exit 1 ;; esac; }
want "ready: 1 server answered"
want "img-0001 yes
img-0002 no"
want "img-0001: 2662400 bytes, dtype bf16, shape 650,2048"
want "server 127.0.0.1:$sp (node"
cmp "$tmp/emb.bin" "$tmp/out.bin" || { echo "FAIL: out.bin differs from emb.bin"; exit 1; }
echo "ok: README's Using it block works as written"
