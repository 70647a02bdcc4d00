#!/usr/bin/env bash
# The shm upgrade secret reaches only clients on the server's host (review
# finding A1; docs/security.md).  Network namespaces, as root (exit 77
# elsewhere): an ecstore-server with a token and a shm socket on host srv,
# a client holding the same good token on host far.
#
#   the attack: far says HELLO (the token proof, then the full reply) and
#   reads the reply on the wire: it must carry no upgrade flag and no
#   secret; far's library client still works, over tcp;
#   on srv, clients over 127.0.0.1 and over srv's own address get a secret,
#   and the library client upgrades to shm with it.
#
# usage: netns_shm_secret.sh BIN_DIR
set -u
BIN=${1:?usage: netns_shm_secret.sh BIN_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/netns_hosts.sh
. "$HERE/netns_hosts.sh"

mh_tmp a1
mh_init e1a
mh_host srv 11 || fail "cannot make host srv"
mh_host far 12 || fail "cannot make host far"
NS=a1
SRV=$(mh_ip 11)
PROBE="$BIN/ecs-hello-probe"
echo "a1-token-$$-$RANDOM$RANDOM" >"$TMP/token"
chmod 600 "$TMP/token"
mh_bg srv "$TMP/server.log" "$BIN/ecstore-server" --listen 0.0.0.0:7700 --redis none --ns "$NS" \
  --pool-size 16M --no-mlock --auth-token-file "$TMP/token" --shm-socket "$TMP/srv.sock"
mh_wait_tcp srv 127.0.0.1 7700 20 || fail "ecstore-server on srv did not start"

# hello HOST ADDR: the probe's line for a HELLO from HOST to ADDR:7700
hello() {
  mh_exec "$1" timeout 20 "$PROBE" hello "$2:7700" "$NS" "$TMP/token" 2>>"$TMP/probe.log" ||
    fail "HELLO from $1 to $2 was refused"
}
conn() { # conn HOST ADDR: the transport a library client from HOST to ADDR:7700 ends up on
  mh_exec "$1" timeout 20 "$PROBE" connect "$2:7700" "$NS" "$TMP/token" 2>>"$TMP/probe.log" ||
    fail "client from $1 to $2 failed"
}

out=$(hello far "$SRV")
echo "far -> $SRV: $out"
case "$out" in
*"upgrade=none"*) ;;
*) fail "a remote client got the shm upgrade secret: $out" ;;
esac
out=$(conn far "$SRV")
echo "far -> $SRV: $out"
[ "$out" = transport=tcp ] || fail "the remote client should work over tcp: $out"

for a in 127.0.0.1 "$SRV"; do
  out=$(hello srv "$a")
  echo "srv -> $a: $out"
  case "$out" in
  *"upgrade=issued"*) ;;
  *) fail "a client on the server's host (over $a) got no shm upgrade secret: $out" ;;
  esac
  out=$(conn srv "$a")
  echo "srv -> $a: $out"
  [ "$out" = transport=shm ] || fail "a client on the server's host (over $a) did not upgrade to shm: $out"
done
echo "PASS: the shm upgrade secret goes to clients on the server's host only"
