# Shared body of examples/disagg_1e1pd_example.sh and
# examples/disagg_1e1p1d_example.sh (sourced; not run directly).
#
# Starts, in a fresh temp dir, on free ports: redis-server, ecstore-server
# (ecstore backend only), the encoder workers, the PD workers (or prefill
# and decode workers), the proxy; runs the load generator; checks the
# tokens against the single-process reference; stops everything it started
# on success, failure or Ctrl-C.  Every wait is bounded.
# shellcheck shell=bash

EX_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

ex_usage() {
  local mode=$1
  cat <<EOF
usage: $(basename "$0") [options]

Runs the $mode pipeline of stand-in engine instances over the EC connector
(docs/examples.md), prints a serving-benchmark report and checks the tokens
against a single-process run of the same workload.

Pipeline
  --backend B              connector backend: ecstore | disk | redis (ecstore)
  --protocol P             ecstore data path: auto | tcp | shm (auto)
  --encoders N             encoder workers (1)
EOF
  if [ "$mode" = 1E1P1D ]; then
    cat <<EOF
  --prefills N             prefill workers (1)
  --decodes N              decode workers (1)
  --kv-timeout-ms MS       decode's wait for a request's KV (10000)
EOF
  else
    echo "  --pds N                  prefill+decode workers (1)"
  fi
  cat <<EOF
  --pool-size SIZE         ecstore-server pool (512M)
Workload
  --requests N             (100)
  --images-per-request N   (1)
  --image-size WxH         (700x728: 650 tokens x 2048 bf16 = 2.6 MB per image)
  --prompt-tokens N        (150)
  --output-tokens N        (100)
  --unique-images N        distinct images; the rest repeat, giving cache hits
                           (default 3/4 of requests x images; 0: all distinct)
  --concurrency N          requests in flight (4)
  --seed N                 workload seed (1)
Run
  --build-dir DIR          where bin/ecs-example-* are (default: build, then build-ex)
  --allow-failures         exit 0 even if some requests failed (fault tests)
  --strict                 fail if a component exits non-zero when stopped
  --summary-out FILE       the figures as key=value lines (bench/bench_examples.sh)
  --keep                   keep the temp dir (logs, config, tokens)
Fault injection (tests)
  --fault server-down      stop ecstore-server before the load: saves fail, consumers recompute
  --fault evict            after has() finds hits the proxy floods the pool so they are
                           evicted before the load: misses, consumers recompute
EOF
  if [ "$mode" = 1E1P1D ]; then
    echo "  --fault kv-stall         prefill stalls every 2nd request past decode's KV timeout"
  fi
  echo "  --check-options          check the options and exit 0, starting nothing (scripts/demo.sh"
  echo "                           asks this before it installs or builds)"
  echo "  --help                   this text"
}

ex_die() {
  echo "error: $*" >&2
  exit 2
}

# ---- process bookkeeping ------------------------------------------------
EX_PIDS=()   # every background process we started (each leads its own group)
EX_NAMES=()  # its name, for messages
EX_TMP=""
EX_KEEP=0
EX_STRICT=0
EX_EXIT_BAD=0

# ex_start NAME CMD...: starts CMD in its own process group (setsid), output to NAME.log.
ex_start() {
  local name=$1
  shift
  setsid "$@" >"$EX_TMP/$name.log" 2>&1 </dev/null &
  EX_PIDS+=("$!")
  EX_NAMES+=("$name")
}

# Stops every process we started: SIGTERM to its group, up to 5 s, then SIGKILL.
ex_stop_all() {
  local i pid deadline
  for pid in "${EX_PIDS[@]}"; do
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  deadline=$((SECONDS + 5))
  for i in "${!EX_PIDS[@]}"; do
    pid=${EX_PIDS[$i]}
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
      sleep 0.05
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "warning: ${EX_NAMES[$i]} (pid $pid) ignored SIGTERM; killing it" >&2
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
    local st=0
    wait "$pid" 2>/dev/null || st=$?
    if [ "$st" -ne 0 ] && [ "$st" -ne 143 ]; then
      echo "warning: ${EX_NAMES[$i]} exited with status $st (log: $EX_TMP/${EX_NAMES[$i]}.log)" >&2
      tail -n 20 "$EX_TMP/${EX_NAMES[$i]}.log" >&2 2>/dev/null || true
      EX_EXIT_BAD=1
    fi
  done
  EX_PIDS=()
  EX_NAMES=()
}

# ex_run_fg CMD...: runs CMD with the script's stdout, but in the background
# so that a signal to the script runs its trap at once; sets EX_FG_RC.
EX_FG_PID=""
ex_run_fg() {
  "$@" &
  EX_FG_PID=$!
  EX_FG_RC=0
  wait "$EX_FG_PID" || EX_FG_RC=$?
  EX_FG_PID=""
}

ex_cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$EX_FG_PID" ]; then
    kill -TERM "$EX_FG_PID" 2>/dev/null || true
    wait "$EX_FG_PID" 2>/dev/null || true
  fi
  ex_stop_all
  if [ -n "$EX_TMP" ] && [ -d "$EX_TMP" ]; then
    if [ "$EX_KEEP" = 1 ] || { [ "$rc" -ne 0 ] && [ -n "${ECS_EXAMPLES_KEEP_ON_FAIL:-}" ]; }; then
      echo "kept $EX_TMP" >&2
    else
      rm -rf "$EX_TMP"
    fi
  fi
  exit "$rc"
}

ex_on_signal() {
  echo "interrupted: stopping everything" >&2
  exit 130
}

# ex_wait_file NAME FILE SECS: waits for FILE while NAME's process lives.
ex_wait_file() {
  local name=$1 file=$2 secs=$3 pid=${EX_PIDS[${#EX_PIDS[@]} - 1]}
  local deadline=$((SECONDS + secs))
  while [ ! -s "$file" ]; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "error: $name exited while starting; its log:" >&2
      cat "$EX_TMP/$name.log" >&2
      exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "error: $name did not start within ${secs}s; its log:" >&2
      cat "$EX_TMP/$name.log" >&2
      exit 1
    fi
    sleep 0.05
  done
}

# Starts redis-server on a random free port (a few tries: a port can be
# taken between the choice and the bind).  Sets EX_REDIS_PORT.
ex_start_redis() {
  local port _try
  for _try in 1 2 3 4 5 6 7 8; do
    port=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
    ex_start redis redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
      --dir "$EX_TMP" --daemonize no --protected-mode no
    local pid=${EX_PIDS[${#EX_PIDS[@]} - 1]} deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
      if grep -q "Ready to accept connections" "$EX_TMP/redis.log" 2>/dev/null; then
        EX_REDIS_PORT=$port
        return 0
      fi
      sleep 0.05
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    unset 'EX_PIDS[${#EX_PIDS[@]}-1]' 'EX_NAMES[${#EX_NAMES[@]}-1]'
    EX_PIDS=("${EX_PIDS[@]}")
    EX_NAMES=("${EX_NAMES[@]}")
  done
  echo "error: redis-server did not start; last log:" >&2
  cat "$EX_TMP/redis.log" >&2
  exit 1
}

ex_port() {
  tr -d ' \n' <"$1"
}

# ex_worker NAME ROLE CONFIG BIN [args]: starts a worker, waits until it is
# ready, sets EX_ADDR to "NAME=127.0.0.1:PORT" (for the proxy's lists).
ex_worker() {
  local name=$1 role=$2 cfg=$3 bin=$4
  shift 4
  ex_start "$name" "$bin/ecs-example-worker" --role "$role" --instance-id "$name" \
    --connector-config "$cfg" --listen 127.0.0.1:0 --port-file "$EX_TMP/$name.port" "$@"
  ex_wait_file "$name" "$EX_TMP/$name.port" 20
  EX_ADDR="$name=127.0.0.1:$(ex_port "$EX_TMP/$name.port")"
}

# ---- the run ------------------------------------------------------------
ex_main() {
  local mode=$1
  shift
  local backend=ecstore protocol=auto encoders=1 pds=1 prefills=1 decodes=1
  local requests=100 ipr=1 image_size=700x728 prompt=150 output=100 unique="" conc=4 seed=1
  local build_dir="" allow_fail=0 fault="" pool_size=512M kv_timeout=10000 summary_out="" check_only=0
  while [ $# -gt 0 ]; do
    local opt=$1
    case "$opt" in
    --help | -h)
      ex_usage "$mode"
      exit 0
      ;;
    --check-options) check_only=1; shift; continue ;;
    --allow-failures) allow_fail=1; shift; continue ;;
    --keep) EX_KEEP=1; shift; continue ;;
    --strict) EX_STRICT=1; shift; continue ;;
    esac
    case " --backend --protocol --encoders --pds --prefills --decodes --requests --images-per-request --image-size
      --prompt-tokens --output-tokens --unique-images --concurrency --seed --build-dir --pool-size --kv-timeout-ms
      --summary-out --fault " in
    *[[:space:]]"$opt"[[:space:]]*) ;;
    *) ex_die "unknown option $opt (see --help)" ;;
    esac
    [ $# -ge 2 ] || ex_die "$opt needs a value (see --help)"
    local v=$2
    shift 2
    case "$opt" in
    --backend) backend=$v ;;
    --protocol) protocol=$v ;;
    --encoders) encoders=$v ;;
    --pds) pds=$v ;;
    --prefills) prefills=$v ;;
    --decodes) decodes=$v ;;
    --requests) requests=$v ;;
    --images-per-request) ipr=$v ;;
    --image-size) image_size=$v ;;
    --prompt-tokens) prompt=$v ;;
    --output-tokens) output=$v ;;
    --unique-images) unique=$v ;;
    --concurrency) conc=$v ;;
    --seed) seed=$v ;;
    --build-dir) build_dir=$v ;;
    --pool-size) pool_size=$v ;;
    --kv-timeout-ms) kv_timeout=$v ;;
    --summary-out) summary_out=$v ;;
    --fault) fault=$v ;;
    *) ex_die "unknown option $opt (see --help)" ;;
    esac
  done
  case "$backend" in ecstore | disk | redis) ;; *) ex_die "--backend must be ecstore, disk or redis" ;; esac
  case "$protocol" in auto | tcp | shm) ;; *) ex_die "--protocol must be auto, tcp or shm" ;; esac
  local n
  for n in "$encoders" "$pds" "$prefills" "$decodes"; do
    if ! [[ "$n" =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt 16 ]; then
      ex_die "instance counts must be 1..16"
    fi
  done
  for n in "$requests" "$ipr" "$prompt" "$output" "$conc" "$seed" "$kv_timeout"; do
    [[ "$n" =~ ^[0-9]+$ ]] || ex_die "'$n' is not a whole number"
  done
  [[ "$image_size" =~ ^[0-9]+x[0-9]+$ ]] || ex_die "--image-size wants WxH, e.g. 700x728"
  if [ -z "$unique" ]; then
    unique=$((requests * ipr * 3 / 4))
    [ "$unique" -ge 1 ] || unique=1
  fi
  [[ "$unique" =~ ^[0-9]+$ ]] || ex_die "--unique-images wants a whole number"
  case "$fault" in
  "" | evict) ;;
  server-down) [ "$backend" = ecstore ] || ex_die "--fault server-down needs --backend ecstore" ;;
  kv-stall) [ "$mode" = 1E1P1D ] || ex_die "--fault kv-stall is for the 1E1P1D example" ;;
  *) ex_die "unknown --fault $fault" ;;
  esac
  [ "$fault" != evict ] || [ "$backend" = ecstore ] || ex_die "--fault evict needs --backend ecstore"
  [[ "$pool_size" =~ ^[0-9]+(\.[0-9]+)?([KkMmGgTt](i?[Bb])?)?$ ]] ||
    ex_die "--pool-size wants a size such as 512M, 4G or 1.5G"
  [ "$check_only" = 0 ] || exit 0

  if [ -z "$build_dir" ]; then
    for d in "$EX_REPO/build" "$EX_REPO/build-ex"; do
      if [ -x "$d/bin/ecs-example-worker" ]; then
        build_dir=$d
        break
      fi
    done
  fi
  local bin=${build_dir:-$EX_REPO/build}/bin
  for b in ecs-example-worker ecs-example-proxy ecs-example-loadgen ecs-example-reference ecstore-server; do
    [ -x "$bin/$b" ] || ex_die "$bin/$b not found: build first (cmake --preset default && cmake --build --preset default), or pass --build-dir"
  done
  command -v redis-server >/dev/null || ex_die "redis-server not found (scripts/install-deps.sh installs it)"
  command -v setsid >/dev/null || ex_die "setsid not found (util-linux)"

  EX_TMP=$(mktemp -d "${TMPDIR:-/tmp}/ecs-example-XXXXXX")
  trap ex_cleanup EXIT
  trap ex_on_signal INT TERM

  local ns="ex$$"
  echo "== $mode example: backend $backend, protocol $protocol; $requests requests x $ipr image(s) $image_size," \
    "$prompt prompt + $output output tokens, $unique unique images, concurrency $conc"
  echo "== temp dir $EX_TMP"
  ex_start_redis
  local redis="127.0.0.1:$EX_REDIS_PORT"
  local cfg="$EX_TMP/connector.json"
  case "$backend" in
  ecstore)
    ex_start ecstore-server "$bin/ecstore-server" --listen 127.0.0.1:0 --port-file "$EX_TMP/server.port" \
      --pool-size "$pool_size" --redis "$redis" --ns "$ns" --shm-socket "$EX_TMP/ecstore.sock" \
      --log-level warn
    ex_wait_file ecstore-server "$EX_TMP/server.port" 20
    local server_pid=${EX_PIDS[${#EX_PIDS[@]} - 1]}
    printf '{"backend": "ecstore", "servers": "127.0.0.1:%s", "redis_url": "%s", "namespace": "%s", "protocol": "%s"}\n' \
      "$(ex_port "$EX_TMP/server.port")" "$redis" "$ns" "$protocol" >"$cfg"
    ;;
  disk)
    mkdir -p "$EX_TMP/disk"
    printf '{"backend": "disk", "disk_path": "%s", "redis_url": "%s", "namespace": "%s"}\n' \
      "$EX_TMP/disk" "$redis" "$ns" >"$cfg"
    ;;
  redis)
    printf '{"backend": "redis", "redis_url": "%s", "namespace": "%s"}\n' "$redis" "$ns" >"$cfg"
    ;;
  esac

  local enc_list="" pd_list="" pre_list="" dec_list=""
  local i stall=()
  [ "$fault" != kv-stall ] || stall=(--fault-stall-ms $((kv_timeout + 1500)) --fault-every 2)
  for ((i = 0; i < encoders; i++)); do
    ex_worker "encoder-$i" encoder "$cfg" "$bin"
    enc_list+="${enc_list:+,}$EX_ADDR"
  done
  local proxy_args=()
  if [ "$mode" = 1E1P1D ]; then
    for ((i = 0; i < prefills; i++)); do
      ex_worker "prefill-$i" prefill "$cfg" "$bin" "${stall[@]}"
      pre_list+="${pre_list:+,}$EX_ADDR"
    done
    for ((i = 0; i < decodes; i++)); do
      ex_worker "decode-$i" decode "$cfg" "$bin"
      dec_list+="${dec_list:+,}$EX_ADDR"
    done
    proxy_args=(--prefills "$pre_list" --decodes "$dec_list" --kv-timeout-ms "$kv_timeout")
  else
    for ((i = 0; i < pds; i++)); do
      ex_worker "pd-$i" pd "$cfg" "$bin"
      pd_list+="${pd_list:+,}$EX_ADDR"
    done
    proxy_args=(--pds "$pd_list")
  fi
  if [ "$fault" = evict ]; then
    local pool_bytes
    pool_bytes=$(numfmt --from=iec "$pool_size" 2>/dev/null) || ex_die "--pool-size '$pool_size' not understood"
    proxy_args+=(--fault-evict-bytes "$pool_bytes")
  fi
  ex_start proxy "$bin/ecs-example-proxy" --connector-config "$cfg" --encoders "$enc_list" "${proxy_args[@]}" \
    --listen 127.0.0.1:0 --port-file "$EX_TMP/proxy.port"
  ex_wait_file proxy "$EX_TMP/proxy.port" 20
  if [ "$fault" = server-down ]; then
    echo "== fault: stopping ecstore-server before the load (saves fail, consumers recompute)"
    kill -TERM -- "-$server_pid" 2>/dev/null || true
    local until=$((SECONDS + 5))
    while kill -0 "$server_pid" 2>/dev/null && [ "$SECONDS" -lt "$until" ]; do
      sleep 0.05
    done
  fi

  local wl=(--requests "$requests" --images-per-request "$ipr" --image-size "$image_size"
    --prompt-tokens "$prompt" --output-tokens "$output" --unique-images "$unique" --seed "$seed")
  ex_run_fg "$bin/ecs-example-loadgen" --proxy "127.0.0.1:$(ex_port "$EX_TMP/proxy.port")" "${wl[@]}" \
    --concurrency "$conc" --label "$mode, $backend" --tokens-out "$EX_TMP/tokens.txt" \
    --summary-out "$EX_TMP/summary.txt"
  local lrc=$EX_FG_RC
  if [ "$lrc" -ne 0 ] && [ "$lrc" -ne 3 ]; then
    echo "error: the load generator failed (status $lrc)" >&2
    exit 1
  fi
  ex_stop_all
  ex_run_fg "$bin/ecs-example-reference" "${wl[@]}" --check "$EX_TMP/tokens.txt"
  local crc=$EX_FG_RC
  if [ -n "$summary_out" ]; then
    cp "$EX_TMP/summary.txt" "$summary_out"
    if [ "$crc" -eq 0 ]; then echo "correctness=PASS"; else echo "correctness=FAIL"; fi >>"$summary_out"
  fi
  if [ "$crc" -ne 0 ]; then
    echo "FAILED: the disaggregated run's tokens differ from the single-process run (see above)" >&2
    exit 1
  fi
  if [ "$lrc" -eq 3 ] && [ "$allow_fail" != 1 ]; then
    echo "FAILED: some requests failed (see the report; --allow-failures accepts that)" >&2
    exit 1
  fi
  if [ "$EX_STRICT" = 1 ] && [ "$EX_EXIT_BAD" = 1 ]; then
    echo "FAILED: a component exited with an error status (--strict)" >&2
    exit 1
  fi
  exit 0
}
