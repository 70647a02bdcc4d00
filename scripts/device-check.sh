#!/usr/bin/env bash
# One prepared run for a lent GPU machine (issue 22; docs/device.md): the
# CUDA paths and the many-core scaling cells, each step bounded in time.
#
#   scripts/device-check.sh --bundle    here: build out/device-bundle (binaries,
#                                       the shared libraries a bare machine
#                                       lacks, redis-server, the Python package)
#   scripts/device-check.sh             there: check the machine, run, write $OUT
#   scripts/device-check.sh --dry-run   here, no GPU: bundle, then every step
#                                       that needs no GPU with short durations
#   scripts/device-check.sh --help
#
# Options: --quick (very short steps: the ctest check of the dry run),
# --no-build (bundle the binaries of ECS_DEVICE_BUILD as they are),
# --cuda-only (the environment and CUDA steps, no scaling: a rerun of the
# CUDA step in about a minute of device time).
# Environment: ECS_DEVICE_BUNDLE (default out/device-bundle), ECS_DEVICE_BUILD
# (default build-device), OUT (results; default out/device-out),
# ECS_DEVICE_PYTHON (a python with torch; default python3, or the project's
# venv in a dry run), ECS_DEVICE_BUDGET_S (whole run, default 470).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=run
QUICK=0
NO_BUILD=0
CUDA_ONLY=0
for a in "$@"; do
  case $a in
  --bundle) MODE=bundle ;;
  --dry-run) MODE=dry ;;
  --quick) QUICK=1 ;;
  --no-build) NO_BUILD=1 ;;
  --cuda-only) CUDA_ONLY=1 ;;
  -h | --help)
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "device-check: unknown option '$a' (--help)" >&2
    exit 2
    ;;
  esac
done
BUNDLE=${ECS_DEVICE_BUNDLE:-$ROOT/out/device-bundle}
BUILD=${ECS_DEVICE_BUILD:-$ROOT/build-device}
BUDGET=${ECS_DEVICE_BUDGET_S:-470}
MAX_BUNDLE=$((64 << 20))

# ---- the bundle ---------------------------------------------------------------

# glibc's own libraries: every machine has them, and a copy from here
# must never be mixed with the machine's loader.
is_glibc() {
  case ${1##*/} in
  linux-vdso.so* | ld-linux*.so* | libc.so.* | libm.so.* | libmvec.so.* | libpthread.so.* | libdl.so.* | \
    librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | libnss_*.so.* | libthread_db.so.*) return 0 ;;
  esac
  return 1
}

# copy_deps FILE DIR: the non-glibc shared libraries FILE loads, into DIR
# (by their soname, the file itself, not a link).
copy_deps() {
  local f=$1 dir=$2 name path
  mkdir -p "$dir"
  while read -r name path; do
    [ -n "$path" ] || continue
    is_glibc "$name" && continue
    cp -L "$path" "$dir/$name" || return 1
  done < <(ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 } $2 == "=>" && $3 == "not" { print $1, "" }')
  if ldd "$f" | grep -q "not found"; then
    echo "device-check: $f: a library is not found here: $(ldd "$f" | grep 'not found' | tr -s ' \t' ' ')" >&2
    return 1
  fi
}

make_bundle() {
  local bins=(ecstore-server ecstore-cli ecstore-bench ecs-mh-driver)
  if [ "$NO_BUILD" = 0 ]; then
    echo "device-check: building ${bins[*]} libecstore in $BUILD (release)"
    if [ ! -f "$BUILD/CMakeCache.txt" ]; then
      cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DECS_BUILD_TESTS=ON >/dev/null || return 1
    fi
    cmake --build "$BUILD" -j "$(nproc)" --target "${bins[@]}" ecstore >/dev/null || return 1
  fi
  local b
  for b in "${bins[@]}"; do
    [ -x "$BUILD/bin/$b" ] || {
      echo "device-check: $BUILD/bin/$b is not built" >&2
      return 1
    }
  done
  local redis
  redis=$(command -v redis-server || echo /usr/bin/redis-server)
  [ -x "$redis" ] || {
    echo "device-check: no redis-server here (scripts/install-deps.sh)" >&2
    return 1
  }
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/bin" "$BUNDLE/lib/redis" "$BUNDLE/libexec" "$BUNDLE/python"
  for b in "${bins[@]}"; do
    strip --strip-debug -o "$BUNDLE/bin/$b" "$BUILD/bin/$b" || return 1
    copy_deps "$BUILD/bin/$b" "$BUNDLE/lib" || return 1
  done
  local so
  so=$(readlink -f "$BUILD/lib/libecstore.so")
  strip --strip-debug -o "$BUNDLE/lib/libecstore.so" "$so" || return 1
  copy_deps "$so" "$BUNDLE/lib" || return 1
  # redis-server keeps its libraries apart (libssl, libstdc++, ...): on
  # LD_LIBRARY_PATH they would shadow the machine's for torch.
  # Its libstdc++ and libgcc_s are Debian 12's and need glibc 2.36 and 2.35,
  # more than everything else here (2.34): they sit in lib/redis/cxx, and
  # ECS_REDIS_SYSTEM_CXX=1 leaves them out for a machine with its own.
  cp -L "$redis" "$BUNDLE/libexec/redis-server" || return 1
  copy_deps "$redis" "$BUNDLE/lib/redis" || return 1
  mkdir -p "$BUNDLE/lib/redis/cxx"
  mv "$BUNDLE"/lib/redis/libstdc++.so* "$BUNDLE"/lib/redis/libgcc_s.so* "$BUNDLE/lib/redis/cxx/" 2>/dev/null
  cat >"$BUNDLE/bin/redis-server" <<'EOF'
#!/bin/sh
# The bundle's redis-server with its own libraries (scripts/device-check.sh);
# ECS_REDIS_SYSTEM_CXX=1: the machine's libstdc++ and libgcc_s instead.
d=${0%/*}
LD_LIBRARY_PATH=$d/../lib/redis:$d/../lib/redis/cxx
[ -z "${ECS_REDIS_SYSTEM_CXX:-}" ] || LD_LIBRARY_PATH=$d/../lib/redis
export LD_LIBRARY_PATH
exec "$d/../libexec/redis-server" "$@"
EOF
  chmod 0755 "$BUNDLE/bin/redis-server"
  cp -r "$ROOT/ec_connector/python/ecstore" "$BUNDLE/python/" || return 1
  find "$BUNDLE/python" -name __pycache__ -prune -exec rm -rf {} +
  # what vLLM would cost (it does not travel: see docs/device.md)
  local vsz="not installed here"
  local venv
  venv=$(ls -d /root/.cache/ecstore/pyenv-*/lib/python3*/site-packages 2>/dev/null | head -n 1)
  if [ -n "$venv" ] && [ -d "$venv/vllm" ]; then
    vsz="$(du -sm "$venv/vllm" | cut -f1) MiB for vllm/ alone, before transformers and its other dependencies"
  fi
  local glibc cxx
  glibc=$(for f in "$BUNDLE"/bin/ecstore-* "$BUNDLE"/bin/ecs-* "$BUNDLE"/lib/*.so* "$BUNDLE"/libexec/* "$BUNDLE"/lib/redis/*.so*; do
    objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*'
  done | sort -V -u | tail -n 1)
  cxx=$(for f in "$BUNDLE"/lib/redis/cxx/*; do
    objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*'
  done | sort -V -u | tail -n 1)
  {
    echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -n 1)"
    echo "needs glibc ${glibc#GLIBC_} or newer (redis-server's bundled libstdc++/libgcc_s: ${cxx#GLIBC_}; ECS_REDIS_SYSTEM_CXX=1 uses the machine's)"
    echo "vllm: $vsz"
    echo "files:"
    (cd "$BUNDLE" && find . -type f | sort | while read -r f; do printf '  %8d %s\n' "$(stat -c %s "$f")" "${f#./}"; done)
  } >"$BUNDLE/MANIFEST"
  local total
  total=$(du -sb "$BUNDLE" | cut -f1)
  echo "device-check: bundle $((total >> 20)) MiB ($total bytes; limit 64 MiB), needs glibc ${glibc#GLIBC_}+"
  if [ "$total" -gt "$MAX_BUNDLE" ]; then
    echo "device-check: the bundle is over 64 MiB" >&2
    return 1
  fi
  echo "bundle: $BUNDLE"
}

if [ "$MODE" = bundle ]; then
  make_bundle || {
    echo "device-check: FAILED: cannot make the bundle" >&2
    exit 1
  }
  exit 0
fi

# ---- the run ------------------------------------------------------------------

if [ "$MODE" = dry ]; then
  make_bundle || {
    echo "device-check: FAILED: cannot make the bundle"
    exit 1
  }
fi
OUT=${OUT:-$ROOT/out/device-out}
mkdir -p "$OUT" || exit 1
LOG=$OUT/device-check.log
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
T0=$(date +%s)
TMP=$(mktemp -d /tmp/ecs-devcheck-XXXXXX)
PIDS=()
finish() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap finish EXIT
trap 'exit 1' INT TERM

say() { echo "device-check: $*"; }
stop() { # the last line, and the exit code
  say "$1"
  exit "${2:-1}"
}
elapsed() { echo $(($(date +%s) - T0)); }
left() { echo $((BUDGET - $(elapsed))); }

export PATH=$BUNDLE/bin:$PATH
export LD_LIBRARY_PATH=$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export ECS_BIN_DIR=$BUNDLE/bin
RAW=$OUT/raw.csv
echo "step,threads,op,size,batch,conns,path,gbps,mops,p50_us,p99_us" >"$RAW"
STATUS=() # one "name: result" per step, for the summary

# ---- environment --------------------------------------------------------------
echo "== environment ($(date -u +%Y-%m-%dT%H:%M:%SZ), mode $MODE$([ "$QUICK" = 1 ] && echo ', quick'))"
[ -d "$BUNDLE/bin" ] || stop "FAILED: no bundle at $BUNDLE (run --bundle here and carry out/device-bundle)" 2
sed -n '1,4p' "$BUNDLE/MANIFEST" 2>/dev/null
if head=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null); then
  bc=$(sed -n 's/^commit \([0-9a-f]*\).*/\1/p' "$BUNDLE/MANIFEST" 2>/dev/null)
  [ "$bc" = "$head" ] || say "warning: the bundle was made at commit ${bc:-?}, the tree is at $head (scripts/device-check.sh --bundle)"
fi
echo "machine: $(uname -srm), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), $(ldd --version | head -n 1)"
echo "load: $(cat /proc/loadavg)"
missing=""
for f in "$BUNDLE"/bin/ecstore-* "$BUNDLE"/bin/ecs-* "$BUNDLE"/lib/libecstore.so; do
  nf=$(ldd "$f" 2>&1 | grep -E 'not found|version .* not found' | tr -s ' \t' ' ')
  [ -z "$nf" ] || missing="$missing ${f##*/}:$nf;"
done
[ -z "$missing" ] || stop "FAILED: bundled binaries do not load here:$missing (a newer glibc is needed? see MANIFEST)" 2
ecstore-server --help >/dev/null 2>&1 || stop "FAILED: ecstore-server --help does not run" 2
if ! rv=$(redis-server --version 2>&1); then
  # the bundled libstdc++ may want a newer glibc than the machine's: try its own
  if rv2=$(ECS_REDIS_SYSTEM_CXX=1 redis-server --version 2>&1); then
    say "redis-server runs with the machine's libstdc++, not the bundle's ($rv)"
    export ECS_REDIS_SYSTEM_CXX=1
    rv=$rv2
  else
    stop "FAILED: the bundle's redis-server does not run: $rv / with the machine's libstdc++: $rv2" 2
  fi
fi
echo "binaries load: ecstore-server, ecstore-cli, ecstore-bench, ecs-mh-driver, libecstore.so; $rv"

# the first python that imports torch: python3, then the usual other places
# (a dry run: the project's venv too)
PY=${ECS_DEVICE_PYTHON:-}
if [ -z "$PY" ]; then
  PY=python3
  cands=(python3 python /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python /opt/*/bin/python3)
  [ "$MODE" = dry ] && cands+=(/root/.cache/ecstore/pyenv-*/bin/python)
  for v in "${cands[@]}"; do
    command -v "$v" >/dev/null 2>&1 || continue
    if timeout 60 "$v" -c 'import torch' 2>/dev/null; then
      PY=$v
      break
    fi
  done
fi
TORCH=$(timeout 60 "$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.device_count())' 2>&1 | tail -n 1)
NUMPY=$(timeout 30 "$PY" -c 'import numpy; print(numpy.__version__)' 2>/dev/null || echo "absent (the connector's pinned load pool needs it)")
echo "python: $PY ($("$PY" --version 2>&1)); torch: $TORCH; numpy: $NUMPY"
GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2>/dev/null
  GPU=1
fi
case $TORCH in *"available True"*) GPU=$((GPU | 2)) ;; esac
if [ "$MODE" = run ]; then
  [ "$GPU" = 3 ] || stop "FAILED: no GPU usable: nvidia-smi $([ $((GPU & 1)) = 1 ] && echo ok || echo 'absent or failing'), torch: $TORCH" 2
  [ "$(nproc)" -ge 8 ] || say "warning: $(nproc) cores: the 8-connection cells share them"
fi

# libcudart for cudaHostRegister (the pool dlopens "libcudart.so"): torch's
# own copy first, so that the pool in device_cuda.py's process shares
# torch's runtime (dlopen of a link to a file already loaded returns it),
# else the toolkit's.  torch's wheels have only a versioned name: it is
# linked under the plain one in a temp dir on the library path.
CUDART=""
if [ "$GPU" = 3 ] || [ "$MODE" = dry ]; then
  c=$("$PY" - <<'EOF' 2>/dev/null
import glob, os, torch
d = os.path.dirname(torch.__file__)
for pat in ("/lib/libcudart.so*", "/../nvidia/*/lib/libcudart.so*", "/../nvidia/cuda_runtime/lib/libcudart.so*"):
    for p in sorted(glob.glob(d + pat)):
        print(os.path.realpath(p))
        raise SystemExit
EOF
  )
  [ -n "$c" ] || c=$(ldconfig -p 2>/dev/null | awk '$1 == "libcudart.so" { print $NF; exit }')
  [ -n "$c" ] || c=$(ls /usr/local/cuda/lib64/libcudart.so /usr/local/cuda*/lib*/libcudart.so 2>/dev/null | head -n 1)
  if [ -n "$c" ]; then
    mkdir -p "$TMP/cudart"
    ln -sf "$(readlink -f "$c")" "$TMP/cudart/libcudart.so"
    CUDART=$TMP/cudart
    echo "libcudart for the pool: $c"
  else
    echo "libcudart: not found (the pool cannot be registered with CUDA)"
  fi
fi
STATUS+=("environment: ok")

# ---- helpers ------------------------------------------------------------------

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_port() { # wait_port PORT PID
  local _
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
start_redis() { # start_redis NAME -> port in RPORT
  RPORT=$(free_port)
  mkdir -p "$TMP/$1"
  (cd "$TMP/$1" && exec redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize no >"$TMP/$1.log" 2>&1) &
  PIDS+=($!)
  wait_port "$RPORT" $! || {
    tail -n 5 "$TMP/$1.log"
    return 1
  }
}
start_server() { # start_server NAME ARGS... -> port in SPORT, pid in SPID
  local name=$1
  shift
  SPORT=$(free_port)
  ecstore-server --listen "127.0.0.1:$SPORT" --unprotected --log-level info "$@" >"$TMP/$name.log" 2>&1 &
  SPID=$!
  PIDS+=("$SPID")
  wait_port "$SPORT" $SPID || {
    tail -n 5 "$TMP/$name.log"
    return 1
  }
}
scrape() { # scrape PORT: the /metrics body
  (
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n' >&3
    timeout 5 cat <&3
  )
}
# step NAME SECONDS CMD...: runs CMD bounded by SECONDS (and by the budget
# left), logs it, records "NAME: ok|failed (rc)|timed out|skipped".
step() {
  local name=$1 lim=$2
  shift 2
  local l
  l=$(left)
  if [ "$l" -lt 10 ]; then
    say "$name: skipped: the time budget is spent"
    STATUS+=("$name: skipped (time budget)")
    return 1
  fi
  [ "$lim" -le "$l" ] || lim=$l
  echo
  echo "== $name (at most ${lim}s; $(elapsed)s so far; load $(cut -d' ' -f1-3 /proc/loadavg))"
  timeout -k 5 "$lim" "$@"
  local rc=$?
  case $rc in
  0) STATUS+=("$name: ok") ;;
  124 | 137) STATUS+=("$name: timed out after ${lim}s") ;;
  *) STATUS+=("$name: failed (rc $rc)") ;;
  esac
  return $rc
}
# fn_step NAME FN: a step that is a shell function; every command in it is
# bounded on its own (wait_port, timeout), so it needs no outer timeout.
fn_step() {
  local name=$1
  shift
  if [ "$(left)" -lt 10 ]; then
    say "$name: skipped: the time budget is spent"
    STATUS+=("$name: skipped (time budget)")
    return 1
  fi
  echo
  echo "== $name ($(elapsed)s so far; load $(cut -d' ' -f1-3 /proc/loadavg))"
  if "$@"; then STATUS+=("$name: ok"); else STATUS+=("$name: failed"); fi
}
# the CSV rows of an ecstore-bench net run, tagged with the step and threads
tag_csv() { # tag_csv FILE STEP THREADS
  [ -f "$1" ] && tail -n +2 "$1" | sed "s/^/$2,$3,/" >>"$RAW"
}

# durations: the device's, the dry run's (2 busy cores), --quick's
if [ "$QUICK" = 1 ]; then
  REPS=1 SECS=0.05 THREADS="1 2" CONNS=1,2 BIG=1M MH_N=4 MH_SIZE=256K MH_REPS=2 H2D_ARGS=--quick CUDA_POOL=256M
elif [ "$MODE" = dry ]; then
  REPS=2 SECS=0.1 THREADS="1 2" CONNS=1,2 BIG=1M,4M MH_N=8 MH_SIZE=1M MH_REPS=5 H2D_ARGS=--quick CUDA_POOL=256M
else
  REPS=3 SECS=0.25 THREADS="1 2 4 8" CONNS=1,2,4,8 BIG=1M,16M MH_N=32 MH_SIZE=16M MH_REPS=15 H2D_ARGS="" CUDA_POOL=1G
fi

# ---- 1. CUDA ------------------------------------------------------------------

cuda_server() {
  start_redis redis-cuda || return 1
  local rp=$RPORT
  MP=$(free_port)
  LD_LIBRARY_PATH=$BUNDLE/lib${CUDART:+:$CUDART} start_server srv-cuda --redis "127.0.0.1:$rp" --ns devcheck \
    --pool-size "$CUDA_POOL" --cuda-register --metrics-listen "127.0.0.1:$MP" --shm-socket "$TMP/cuda.sock" \
    --lease-timeout-ms 300000 || return 1
  CPORT=$SPORT
  CRPORT=$rp
  local m ready
  m=$(scrape "$MP" | awk '$1 == "ecstore_pool_cuda_registered" { print $2 }')
  ready=$(grep -o 'ready: .*' "$TMP/srv-cuda.log" | head -n 1)
  echo "server: $ready"
  grep -i 'cuda' "$TMP/srv-cuda.log" | grep -v 'ready:' | head -n 3
  echo "server /metrics: ecstore_pool_cuda_registered ${m:-absent}"
  # the STAT reply carries the same flag (ecstore-cli stat): both must agree
  local st
  st=$(LD_LIBRARY_PATH=$BUNDLE/lib timeout 20 "$BUNDLE/bin/ecstore-cli" --server "127.0.0.1:$CPORT" --ns devcheck \
    stat --json | sed -n 's/.*"pool_cuda_registered": *\([a-z]*\).*/\1/p')
  echo "server STAT (ecstore-cli stat --json): pool_cuda_registered ${st:-absent}"
  CUDA_REG=${m:-absent}
  case "$m:$st" in
  1:true | 0:false) ;;
  *) CUDA_REG="${m:-absent} (/metrics) but ${st:-absent} (STAT)" ;;
  esac
}

echo
echo "== 1. CUDA"
CUDA_REG="not run"
if [ "$GPU" = 3 ]; then
  fn_step "cuda: server with --cuda-register" cuda_server
  if [ "$CUDA_REG" = 1 ]; then STATUS+=("cuda: pool registered: yes (ecstore_pool_cuda_registered 1)"); else STATUS+=("cuda: pool registered: NO ($CUDA_REG)"); fi
  step "cuda: H2D and the connector's save/load" 150 env PYTHONPATH="$BUNDLE/python" \
    ECSTORE_LIB="$BUNDLE/lib/libecstore.so" LD_LIBRARY_PATH="$BUNDLE/lib${CUDART:+:$CUDART}" \
    "$PY" "$ROOT/scripts/device_cuda.py" --server "127.0.0.1:$CPORT" --redis "127.0.0.1:$CRPORT" \
    --json "$OUT/cuda.json" $H2D_ARGS
else
  say "no GPU: CUDA checks skipped"
  cat <<EOF
   plan on a GPU machine:
   - ecstore-server --cuda-register --pool-size 1G; /metrics ecstore_pool_cuda_registered must be 1,
     and STAT (ecstore-cli stat --json) pool_cuda_registered true
   - scripts/device_cuda.py: H2D GB/s of 8 x 16 MiB from the pinned pool, a client's shm
     view of the server's pool (as mapped, then cudaHostRegister'ed), pageable memory
     and torch pinned tensors, 7 alternating rounds, every byte read back;
     ecstore.vllm.ECStoreConnector: 8 CUDA bf16 650x2048 saves (side stream) and loads
     (async H2D from its pinned pool), bit-identical
EOF
  STATUS+=("cuda: skipped (no GPU)")
  # what runs without a GPU: the server's --cuda-register path, and the
  # check's own plumbing with CPU tensors when a python with torch is here
  fn_step "cuda plumbing: server --cuda-register without a GPU" cuda_server
  echo "(without a GPU the pool stays unregistered: ecstore_pool_cuda_registered $CUDA_REG)"
  if "$PY" -c 'import torch' 2>/dev/null; then
    step "cuda plumbing: device_cuda.py --device cpu" 150 env PYTHONPATH="$BUNDLE/python" \
      ECSTORE_LIB="$BUNDLE/lib/libecstore.so" "$PY" "$ROOT/scripts/device_cuda.py" --device cpu --quick --standin \
      --server "127.0.0.1:$CPORT" --redis "127.0.0.1:$CRPORT" --json "$OUT/cuda.json"
  else
    say "no python with torch here: device_cuda.py not run"
    STATUS+=("cuda plumbing: device_cuda.py not run (no torch)")
  fi
fi

# ---- 2. scaling ---------------------------------------------------------------

echo
echo "== 2. scaling"
[ "$CUDA_ONLY" = 0 ] || { say "--cuda-only: scaling steps not run"; THREADS=""; }
for t in $THREADS; do
  step "tcp gets $BIG x 8 vs raw stream, --threads $t" 75 \
    ecstore-bench net --paths tcp --threads "$t" --sizes "$BIG" --batches 8 --conns "$CONNS" \
    --reps "$REPS" --seconds "$SECS" --no-redis --csv "$TMP/big-t$t.csv"
  tag_csv "$TMP/big-t$t.csv" big "$t"
  step "64 KiB x 32 vs Redis GET/SET, --threads $t" 60 \
    ecstore-bench net --paths tcp --threads "$t" --sizes 64K --batches 32 --conns "$CONNS" \
    --reps "$REPS" --seconds "$SECS" --csv "$TMP/small-t$t.csv"
  tag_csv "$TMP/small-t$t.csv" small "$t"
done
[ "$CUDA_ONLY" = 1 ] || step "shm copy gets vs memcpy" 75 \
  ecstore-bench net --paths shm --sizes "$BIG" --batches 8 --conns "$CONNS" --reps "$REPS" --seconds "$SECS" \
  --no-redis --csv "$TMP/shm.csv"
tag_csv "$TMP/shm.csv" shm 0

# A located get (the client asks Redis where each key is): a batch held by
# one server against the same batch spread over two, same Redis.
located() {
  start_redis redis-loc || return 1
  local rp=$RPORT sp
  local args=(--redis "127.0.0.1:$rp" --timeout-ms 60000)
  start_server srv-one --redis "127.0.0.1:$rp" --ns one --pool-size 2G --log-level warn || return 1
  start_server srv-two-a --redis "127.0.0.1:$rp" --ns two --pool-size 1G --log-level warn || return 1
  start_server srv-two-b --redis "127.0.0.1:$rp" --ns two --pool-size 1G --log-level warn || return 1
  sp=$(free_port)
  ecs-mh-driver rawserve --listen "127.0.0.1:$sp" >"$TMP/raw.log" 2>&1 &
  PIDS+=($!)
  wait_port "$sp" $! || return 1
  sleep 0.3 # registry entries
  local ns
  for ns in one two; do
    timeout 60 ecs-mh-driver put "${args[@]}" --ns "$ns" --placement hash --prefix loc --n "$MH_N" \
      --size "$MH_SIZE" || return 1
    echo "$ns: objects per server: $(timeout 30 ecs-mh-driver holders "${args[@]}" --ns "$ns" --prefix loc \
      --n "$MH_N" | awk '{ n[$2]++ } END { for (k in n) printf "%s=%d ", k, n[k] }')"
    timeout 90 ecs-mh-driver bench "${args[@]}" --ns "$ns" --prefix loc --n "$MH_N" --size "$MH_SIZE" --batches "$MH_N" \
      --reps "$MH_REPS" --raw "127.0.0.1:$sp" | tee "$TMP/loc-$ns.txt" || return 1
  done
  local one two
  one=$(sed -n 's/.*ecstore get \([0-9.]*\) ms.*/\1/p' "$TMP/loc-one.txt")
  two=$(sed -n 's/.*ecstore get \([0-9.]*\) ms.*/\1/p' "$TMP/loc-two.txt")
  echo "located get of $MH_N x $MH_SIZE: one server $one ms, two servers $two ms (median; ratio two/one $(awk -v a="$two" -v b="$one" 'BEGIN { if (b > 0) printf "%.2f", a / b }'))"
  echo "located,0,get,$MH_SIZE,$MH_N,1,one-server,,,$one," >>"$RAW"
  echo "located,0,get,$MH_SIZE,$MH_N,1,two-servers,,,$two," >>"$RAW"
}
[ "$CUDA_ONLY" = 1 ] || fn_step "located get: two servers vs one" located

# ---- 3. the table -------------------------------------------------------------

echo
"$PY" "$ROOT/scripts/device_report.py" --out "$OUT" --mode "$MODE" --cuda-registered "$CUDA_REG" \
  --status "$(printf '%s\n' "${STATUS[@]}")" || STATUS+=("report: failed")
echo
echo "files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
fails=$(printf '%s\n' "${STATUS[@]}" | grep -c -E 'failed|timed out|NO ')
what=$([ "$MODE" = dry ] && echo "dry run (no GPU: CUDA checks skipped), figures are a smoke test only" || echo "GPU run")
skipped=$(printf '%s\n' "${STATUS[@]}" | grep -c 'skipped (time budget)')
[ "$skipped" = 0 ] || what="$what; $skipped step(s) skipped for want of time"
if [ "$fails" = 0 ]; then
  stop "ok: $what; $(elapsed)s; table in $OUT/device-check.md" 0
fi
stop "FAILED: $fails step(s) ($(printf '%s\n' "${STATUS[@]}" | grep -E 'failed|timed out|NO ' | tr '\n' ';')); $what; $(elapsed)s" 1
