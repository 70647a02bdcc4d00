#!/usr/bin/env bash
# Multi-host on simulated hosts (issue 14; docs/multihost.md): network
# namespaces joined by veth links, as root (exit 77 where namespaces cannot
# be made).  Redis on its own host, one ecstore-server per host; every
# client is configured with only the Redis URL and the namespace.
#
#   1. encoders on h1 and h2 put with placement local: each object lands on
#      its own host's server (over shm), as the Redis records show; from a
#      host without a server, local falls back to hash;
#   2. a PD client on h3 gets batches spanning both, bytes checked, in one
#      long-lived process;
#   3. h1's server is killed mid-run: its objects become misses, the rest of
#      every batch succeeds, nothing wrong and no batch error; the objects
#      h1's encoder put with replicas 2 (one copy local, one elsewhere) are
#      all still read, from their other copy (a host loss survived);
#   4. a fourth host joins mid-run: its encoder's puts reach it, the PD
#      client (not restarted) reads them, and hash puts from h3 now reach it;
#   5. ecstore-cli --redis URL --ns NS put/get across hosts.
#
# usage: multihost_netns.sh BIN_DIR
set -u
BIN=${1:?usage: multihost_netns.sh BIN_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/netns_hosts.sh
. "$HERE/netns_hosts.sh"
command -v redis-server >/dev/null || { echo "skip: no redis-server" >&2; exit 77; }

mh_tmp mh

mh_init e8mh
for h in r:1 h1:11 h2:12 h3:13; do
  mh_host "${h%%:*}" "${h##*:}" || fail "cannot make host ${h%%:*}"
done
REDIS="$(mh_ip 1):6379"
NS=mh
DRV="$BIN/ecs-mh-driver"

mh_bg r "$TMP/redis.log" redis-server --port 6379 --bind "$(mh_ip 1)" --save '' --appendonly no \
  --protected-mode no --daemonize no
mh_wait_tcp r "$(mh_ip 1)" 6379 10 || fail "redis did not start"

server() { # server HOST IDX
  mh_bg "$1" "$TMP/server-$1.log" "$BIN/ecstore-server" --listen "$(mh_ip "$2"):7700" --unprotected \
    --redis "$REDIS" --ns "$NS" --pool-size 64M --heartbeat-ttl 2 --shm-socket "$TMP/$1.sock"
  eval "SRV_$1=$MH_PID"
  mh_wait_tcp "$1" "$(mh_ip "$2")" 7700 20 || fail "ecstore-server on $1 did not start"
}
server h1 11
server h2 12
server h3 13

# 1. encoders put with placement local
N=24
SIZE=64K
for h in h1 h2; do
  out=$(mh_exec "$h" timeout 60 "$DRV" put --redis "$REDIS" --ns "$NS" --placement local --prefix "e$h" \
    --n $N --size $SIZE) || fail "encoder on $h: $out"
  echo "encoder $h: $out"
  case "$out" in *transport=shm*) ;; *) fail "encoder on $h did not reach its own server over shm: $out" ;; esac
  held=$(mh_exec "$h" timeout 30 "$DRV" holders --redis "$REDIS" --ns "$NS" --prefix "e$h" --n $N |
    grep -c " $(mh_ip "1${h#h}"):7700\$")
  [ "$held" = "$N" ] || fail "placement local: $held of $N objects of the encoder on $h are on its own server"
done

# replicas 2 from h1's encoder: a copy on its own server, the other by hash
out=$(mh_exec h1 timeout 60 "$DRV" put --redis "$REDIS" --ns "$NS" --placement local --replicas 2 \
  --prefix rh1 --n $N --size $SIZE) || fail "encoder on h1, replicas 2: $out"
echo "encoder h1, replicas 2: $out"
case "$out" in *"copies=$((2 * N))/$((2 * N)) "*) ;; *) fail "replicas 2: not every copy stored: $out" ;; esac

# placement local on a host without a server (Redis's): rendezvous over all
out=$(mh_exec r timeout 60 "$DRV" put --redis "$REDIS" --ns "$NS" --placement local --prefix fromr --n 8 \
  --size 4K) || fail "placement local without a local server: $out"
case "$out" in *transport=tcp*) ;; *) fail "placement local from a host without a server: $out" ;; esac

# 2. the PD client on h3, one process for the whole run
echo eh1 >"$TMP/ctl"
echo eh2 >>"$TMP/ctl"
echo rh1 >>"$TMP/ctl"
mh_bg h3 "$TMP/pd.log" "$DRV" getloop --redis "$REDIS" --ns "$NS" --ctl "$TMP/ctl" --n $N \
  --size $SIZE --rounds 400 --interval-ms 100
PD=$MH_PID
rounds() { grep -c '^round=' "$TMP/pd.log"; }
wait_rounds() { # wait_rounds N: until the PD client has done N more rounds
  want=$(($(rounds) + $1))
  for _ in $(seq 1 300); do
    [ "$(rounds)" -ge "$want" ] && return 0
    kill -0 "$PD" 2>/dev/null || fail "the PD client exited early"
    sleep 0.1
  done
  fail "the PD client is stuck"
}
wait_rounds 5
mark_before=$(rounds)

# 3. h1's server killed mid-run
# shellcheck disable=SC2154 # SRV_h1 is set by server() through eval
kill -9 "$SRV_h1"
wait "$SRV_h1" 2>/dev/null
wait_rounds 10
mark_killed=$(rounds)

# 4. a fourth host joins mid-run
mh_host h4 14 || fail "cannot make host h4"
server h4 14
out=$(mh_exec h4 timeout 60 "$DRV" put --redis "$REDIS" --ns "$NS" --placement local --prefix eh4 --n $N \
  --size $SIZE) || fail "encoder on h4: $out"
echo "encoder h4: $out"
echo eh4 >>"$TMP/ctl"
wait_rounds 3
mark_joined=$(rounds)
wait_rounds 5
out=$(mh_exec h3 timeout 60 "$DRV" put --redis "$REDIS" --ns "$NS" --placement hash --prefix late --n 60 \
  --size 4K) || fail "hash puts after the join: $out"
on_h4=$(mh_exec h3 timeout 30 "$DRV" holders --redis "$REDIS" --ns "$NS" --prefix late --n 60 |
  grep -c " $(mh_ip 14):7700\$")
echo "hash puts after the join: $on_h4 of 60 on h4 (1/3 of the live servers = 20)"
[ "$on_h4" -gt 5 ] || fail "hash placement does not reach the joined host ($on_h4 of 60)"
on_h1=$(mh_exec h3 timeout 30 "$DRV" holders --redis "$REDIS" --ns "$NS" --prefix late --n 60 |
  grep -c " $(mh_ip 11):7700\$")
[ "$on_h1" = 0 ] || fail "$on_h1 hash puts went to the dead server h1"
echo stop >>"$TMP/ctl"
wait "$PD" || true

# The PD client's story, round by round.
awk -v before="$mark_before" -v killed="$mark_killed" -v joined="$mark_joined" -v n="$N" '
  /^round=/ {
    k++
    for (i = 1; i <= NF; i++) { split($i, kv, /[=:]/); v[kv[1]] = kv[2] }
    if (v["rc"] != 0 || v["wrong"] != 0 || v["other"] != 0) { print "bad round: " $0; bad = 1 }
    if (v["eh2"] != n) { print "h2 objects missing: " $0; bad = 1 }
    if (v["rh1"] != n) { print "replicated h1 objects missing: " $0; bad = 1 }
    if (k <= before && v["eh1"] != n) { print "h1 objects missing before the kill: " $0; bad = 1 }
    if (k > killed && v["eh1"] != 0) { print "h1 objects read after its server died: " $0; bad = 1 }
    if (k > joined && v["eh4"] != n) { print "joined host not read without a restart: " $0; bad = 1 }
    last = $0
  }
  END { print "PD client: " k " rounds; last: " last; exit bad || k <= joined }' "$TMP/pd.log" ||
  fail "the PD client saw something wrong"

# 5. the CLI, configured the same way
head -c 100000 /dev/urandom >"$TMP/blob"
mh_exec h2 timeout 30 "$BIN/ecstore-cli" --redis "$REDIS" --ns "$NS" --placement local put cli-blob \
  "$TMP/blob" >/dev/null || fail "ecstore-cli put from h2"
mh_exec h3 timeout 30 "$BIN/ecstore-cli" --redis "$REDIS" --ns "$NS" get cli-blob "$TMP/blob.out" ||
  fail "ecstore-cli get on h3"
cmp -s "$TMP/blob" "$TMP/blob.out" || fail "ecstore-cli: the bytes differ"
echo "PASS: multihost over network namespaces"
