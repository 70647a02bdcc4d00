#!/usr/bin/env bash
# ecstore.vllm.ECStoreConnector across simulated hosts (issue 21): network
# namespaces joined by veth links (tests/netns_hosts.sh), as root (exit 77
# where namespaces cannot be made).  Redis on host r, an ecstore-server on
# the encoder's host h1 and one on the prefill host h2.
#
#   1. an encoder-only vLLM instance on h1 saves items into h1's server;
#   2. a prefill instance on h2 (its scheduler and worker, vLLM's own
#      modules) asks ensure_cache_available: the prefetch pulls each item
#      from h1 across the link into h2's server and pins it; the worker's
#      load is a view of h2's pool; every byte is checked;
#   3. a second prefill instance on h2 finds the items already on its host:
#      h2's server still holds one copy of each.
#
# usage: vllm_netns.sh BIN_DIR PYTHON
set -u
BIN=${1:?usage: vllm_netns.sh BIN_DIR PYTHON}
PY=${2:?usage: vllm_netns.sh BIN_DIR PYTHON}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/netns_hosts.sh
. "$HERE/netns_hosts.sh"
case "${ECS_SANITIZE:-0}" in "" | 0 | OFF) ;; *) echo "skip: sanitizer build (python cannot load it)" >&2; exit 77 ;; esac
command -v redis-server >/dev/null || { echo "skip: no redis-server" >&2; exit 77; }
"$PY" -c "import vllm, torch" 2>/dev/null || { echo "skip: $PY has no vllm/torch" >&2; exit 77; }

mh_tmp vllm-mh

mh_init e21v
for h in r:1 h1:11 h2:12; do
  mh_host "${h%%:*}" "${h##*:}" || fail "cannot make host ${h%%:*}"
done
REDIS="$(mh_ip 1):6379"
NS=vllm

mh_bg r "$TMP/redis.log" redis-server --port 6379 --bind "$(mh_ip 1)" --save '' --appendonly no \
  --protected-mode no --daemonize no
mh_wait_tcp r "$(mh_ip 1)" 6379 10 || fail "redis did not start"

for h in h1:11 h2:12; do
  name=${h%%:*}
  mh_bg "$name" "$TMP/server-$name.log" "$BIN/ecstore-server" --listen "$(mh_ip "${h##*:}"):7700" --unprotected \
    --redis "$REDIS" --ns "$NS" --pool-size 64M --shm-socket "$TMP/$name.sock"
  mh_wait_tcp "$name" "$(mh_ip "${h##*:}")" 7700 20 || fail "ecstore-server on $name did not start"
done

export PYTHONPATH="$HERE/../ec_connector/python:$HERE/python${PYTHONPATH:+:$PYTHONPATH}"
export ECSTORE_LIB="${ECSTORE_LIB:-$BIN/../lib/libecstore.so}" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
ROLES="$HERE/python/vllm_roles.py"
ITEMS="x-1:300:1024 x-2:40:2048:f32 x-3:1000:512"
cfg() { # cfg HOST_IDX
  echo "{\"servers\": \"$(mh_ip "$1"):7700\", \"redis_url\": \"redis://$REDIS\", \"namespace\": \"$NS\",
         \"timeout_ms\": 5000, \"prefetch_timeout_ms\": 20000}"
}

# 1. the encoder on h1
out=$(mh_exec h1 timeout 180 "$PY" "$ROLES" produce "$(cfg 11)" "$TMP/model" 5 $ITEMS 2>"$TMP/produce.log") ||
  fail "encoder on h1: $out"
case "$out" in *"saved 3"*) ;; *) fail "encoder on h1: $out" ;; esac
echo "encoder h1: $out"

# 2. a prefill instance on h2 pulls them across the link
out=$(mh_exec h2 timeout 180 "$PY" "$ROLES" consume "$(cfg 12)" 5 60 $ITEMS 2>"$TMP/consume1.log") ||
  fail "prefill on h2: $out"
echo "prefill h2 #1: $out"
case "$out" in "loaded 3 local 3 "*"objects 3") ;; *) fail "prefill on h2 did not load all 3 from its own server: $out" ;; esac

# 3. a second instance on h2 shares the copy
out=$(mh_exec h2 timeout 180 "$PY" "$ROLES" consume "$(cfg 12)" 5 60 $ITEMS 2>"$TMP/consume2.log") ||
  fail "second prefill on h2: $out"
echo "prefill h2 #2: $out"
case "$out" in "loaded 3 local 3 "*"objects 3") ;; *) fail "second prefill on h2: $out" ;; esac
echo "ok"
