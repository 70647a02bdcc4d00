#!/usr/bin/env bash
# STAT carries whether the pool is CUDA-registered, as /metrics does
# (ecstore_pool_cuda_registered), and `ecstore-cli stat` shows it.  Four
# servers, --redis none, each asked through `ecstore-cli stat`, `stat
# --json` and a /metrics scrape, which must agree:
#   --cuda-register, the machine's own libraries (no GPU here: 0)
#   --cuda-register, a libcudart.so that refuses (as without a device): 0
#   --cuda-register, a libcudart.so that accepts: 1
#   no --cuda-register, the accepting libcudart.so on the path: 0
# The stand-in libraries are tests/support/fake_cudart.c; a real GPU is
# scripts/device-check.sh's.
#
# usage: stat_cuda.sh BIN_DIR FAKE_CUDART_DIR
set -u
BIN=${1:?usage: stat_cuda.sh BIN_DIR FAKE_CUDART_DIR}
FAKE=${2:?usage: stat_cuda.sh BIN_DIR FAKE_CUDART_DIR}
TMP=$(mktemp -d /tmp/ecs-statcuda-XXXXXX)
PIDS=""
cleanup() {
  for p in $PIDS; do kill "$p" 2>/dev/null; done
  for p in $PIDS; do wait "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$TMP"/*.log; do
    [ -f "$f" ] && { echo "---- $f" >&2; tail -n 20 "$f" >&2; }
  done
  exit 1
}
scrape() { # scrape PORT: the /metrics body
  (
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n' >&3
    timeout 5 cat <&3
  )
}

# check NAME WANT LIBDIR [SERVER OPTIONS...]
check() {
  local name=$1 want=$2 libdir=$3 i port mport
  shift 3
  LD_LIBRARY_PATH="$libdir" "$BIN/ecstore-server" --listen 127.0.0.1:0 --port-file "$TMP/$name.port" \
    --redis none --ns statcuda --pool-size 8M --no-mlock --shm-socket off --metrics-listen 127.0.0.1:0 \
    "$@" >"$TMP/$name.log" 2>&1 &
  PIDS="$PIDS $!"
  for i in $(seq 200); do
    [ -s "$TMP/$name.port" ] && grep -q 'metrics: http' "$TMP/$name.log" && break
    sleep 0.05
  done
  port=$(cat "$TMP/$name.port" 2>/dev/null)
  mport=$(sed -n 's|.*metrics: http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$TMP/$name.log" | head -n 1)
  [ -n "$port" ] && [ -n "$mport" ] || fail "$name: the server did not start"
  local cli=("$BIN/ecstore-cli" --server "127.0.0.1:$port" --ns statcuda)
  local text json metric
  text=$("${cli[@]}" stat) || fail "$name: ecstore-cli stat failed"
  json=$("${cli[@]}" stat --json) || fail "$name: ecstore-cli stat --json failed"
  metric=$(scrape "$mport" | awk '$1 == "ecstore_pool_cuda_registered" { print $2 }')
  local jv tv
  jv=$(echo "$json" | sed -n 's/.*"pool_cuda_registered": *\([a-z]*\).*/\1/p')
  case "$text" in
  *", not CUDA-registered"*) tv=0 ;;
  *", CUDA-registered"*) tv=1 ;;
  *) tv="absent" ;;
  esac
  echo "$name: stat '$(echo "$text" | grep '  pool ')' json $jv metrics $metric"
  [ "$metric" = "$want" ] || fail "$name: /metrics says ${metric:-nothing}, want $want"
  [ "$tv" = "$want" ] || fail "$name: ecstore-cli stat says '$tv', want $want: $text"
  case "$want:$jv" in
  0:false | 1:true) ;;
  *) fail "$name: stat --json says '${jv:-nothing}', want $want: $json" ;;
  esac
}

check system 0 "${LD_LIBRARY_PATH:-}" --cuda-register
check refused 0 "$FAKE/refuse" --cuda-register
grep -q 'cudaHostRegister of the .* failed (cudaError 100)' "$TMP/refused.log" ||
  fail "refused: the server did not load the refusing libcudart (no warning in its log)"
check registered 1 "$FAKE/ok" --cuda-register
check not-asked 0 "$FAKE/ok"
echo "PASS: STAT, ecstore-cli stat and /metrics agree on the pool's CUDA registration"
