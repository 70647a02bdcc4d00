#!/usr/bin/env bash
# The network-namespace tests skip (77, with a reason) where `ip netns add`
# works but `ip netns exec` does not: in a chroot its mounts are refused
# ("mount --make-rslave /: Permission denied").  `ip` is replaced by a
# stand-in that does just that (and makes nothing: add, del and link
# succeed without touching the system), and tests/multihost_netns.sh must
# exit 77 with a "skip:" line naming the cause, not fail.
# usage: netns_skip.sh SRC_DIR BIN_DIR
set -u
src=${1:?usage: netns_skip.sh SRC_DIR BIN_DIR}
bin=${2:?usage: netns_skip.sh SRC_DIR BIN_DIR}
if [ "$(id -u)" != 0 ]; then
  echo "skip: the stand-in reaches the namespace checks only as root (they exit 77 earlier otherwise)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/ip" <<'EOS'
#!/bin/sh
# Stand-in for iproute2 in a chroot: every namespace call "works" except
# entering one.
if [ "$1" = netns ] && [ "$2" = exec ]; then
  echo "mount --make-rslave /: Permission denied" >&2
  exit 1
fi
exit 0
EOS
chmod +x "$tmp/ip"
rc=0
out=$(PATH="$tmp:$PATH" timeout 60 bash "$src/tests/multihost_netns.sh" "$bin" 2>&1) || rc=$?
echo "$out"
if [ "$rc" != 77 ]; then
  echo "FAIL: multihost_netns.sh exited $rc where ip netns exec fails; expected 77 (skip)"
  exit 1
fi
case $out in
  *"skip: ip netns exec fails here (mount --make-rslave /: Permission denied)"*) ;;
  *) echo "FAIL: no skip line naming the cause"; exit 1 ;;
esac
echo "ok: skipped with the cause"
