#!/usr/bin/env bash
# 2E2PD on four simulated hosts: two encoder hosts and two prefill+decode
# hosts, each with its own ecstore-server, plus a front-end host running
# Redis, the proxy and the load generator; the hosts are network namespaces
# joined by veth links (as root; exit 77 where namespaces cannot be made).
# Every connector is configured with only the Redis URL and the namespace:
# the servers come from Redis's registry, encoders save to the server on
# their own host (placement local, over shm), and PD workers load from
# whichever host holds each embedding (docs/multihost.md).  Prints the
# serving-benchmark report and the objects each server holds, and checks
# the tokens against a single-process run, like the other examples.
#
#   --requests N (60)  --concurrency N (4)  --image-size WxH (700x728)
#   --prompt-tokens N (150)  --output-tokens N (100)
#   --unique-images N (3/4 of the requests)  --seed N (1)
#   --build-dir DIR  --summary-out FILE  --keep  --strict  --help
set -euo pipefail
# shellcheck source=examples/lib/disagg.sh
. "$(dirname "$0")/lib/disagg.sh"
# shellcheck source=tests/netns_hosts.sh
. "$EX_REPO/tests/netns_hosts.sh"

requests=60 conc=4 image_size=700x728 unique="" seed=1 build_dir="" summary_out="" prompt=150 output=100
while [ $# -gt 0 ]; do
  case "$1" in
  --help | -h)
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  --keep) EX_KEEP=1; shift; continue ;;
  --strict) EX_STRICT=1; shift; continue ;;
  esac
  [ $# -ge 2 ] || ex_die "$1 needs a value (see --help)"
  case "$1" in
  --requests) requests=$2 ;;
  --concurrency) conc=$2 ;;
  --image-size) image_size=$2 ;;
  --unique-images) unique=$2 ;;
  --seed) seed=$2 ;;
  --prompt-tokens) prompt=$2 ;;
  --output-tokens) output=$2 ;;
  --build-dir) build_dir=$2 ;;
  --summary-out) summary_out=$2 ;;
  *) ex_die "unknown option $1 (see --help)" ;;
  esac
  shift 2
done
for n in "$requests" "$conc" "$seed" "$prompt" "$output"; do
  [[ "$n" =~ ^[0-9]+$ ]] || ex_die "'$n' is not a whole number"
done
[[ "$image_size" =~ ^[0-9]+x[0-9]+$ ]] || ex_die "--image-size wants WxH, e.g. 700x728"
[ -n "$unique" ] || unique=$((requests * 3 / 4 > 0 ? requests * 3 / 4 : 1))
bin=${build_dir:-$EX_REPO/build}/bin
for b in ecs-example-worker ecs-example-proxy ecs-example-loadgen ecs-example-reference ecstore-server ecstore-cli; do
  [ -x "$bin/$b" ] || ex_die "$bin/$b not found: build first, or pass --build-dir"
done
command -v redis-server >/dev/null || ex_die "redis-server not found (scripts/install-deps.sh installs it)"

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  ex_stop_all
  mh_cleanup
  if [ -z "${EX_TMP:-}" ]; then :; elif [ "$EX_KEEP" = 1 ]; then echo "kept $EX_TMP" >&2; else rm -rf "$EX_TMP"; fi
  exit "$rc"
}
trap cleanup EXIT
trap ex_on_signal INT TERM
mh_init e8ex # exits 77 without root or namespace support (the trap above undoes it)
EX_TMP=$(mktemp -d "${TMPDIR:-/tmp}/ecs-example-XXXXXX")
chmod 0755 "$EX_TMP"

# host name, index (address 10.77.0.INDEX), what runs there
hosts="fe:1 enc0:11 enc1:12 pd0:13 pd1:14"
for h in $hosts; do
  mh_host "${h%%:*}" "${h##*:}" || ex_die "cannot make host ${h%%:*}"
done
ns="ex$$"
redis="$(mh_ip 1):6379"
echo "== 2E2PD on simulated hosts: front end $(mh_ip 1) (Redis, proxy, load generator);" \
  "encoders $(mh_ip 11), $(mh_ip 12); PD $(mh_ip 13), $(mh_ip 14); $requests requests, image $image_size," \
  "$unique unique images, concurrency $conc"
ex_start redis ip netns exec "$MH_PFX-fe" redis-server --port 6379 --bind "$(mh_ip 1)" --save '' \
  --appendonly no --dir "$EX_TMP" --daemonize no --protected-mode no
mh_wait_tcp fe "$(mh_ip 1)" 6379 10 || ex_die "redis-server did not start"
for h in enc0:11 enc1:12 pd0:13 pd1:14; do
  name=${h%%:*} ip=$(mh_ip "${h##*:}")
  ex_start "server-$name" ip netns exec "$MH_PFX-$name" "$bin/ecstore-server" --listen "$ip:7700" --unprotected \
    --redis "$redis" --ns "$ns" --pool-size 256M --shm-socket "$EX_TMP/$name.sock" --log-level warn
  mh_wait_tcp "$name" "$ip" 7700 30 || ex_die "ecstore-server on $name did not start"
done
cfg="$EX_TMP/connector.json"
printf '{"backend": "ecstore", "redis_url": "%s", "namespace": "%s", "placement": "local"}\n' "$redis" "$ns" >"$cfg"

# worker NAME ROLE HOST INDEX: starts it on its host; EX_ADDR for the proxy
worker() {
  local ip
  ip=$(mh_ip "$4")
  ex_start "$1" ip netns exec "$MH_PFX-$3" "$bin/ecs-example-worker" --role "$2" --instance-id "$1" \
    --connector-config "$cfg" --listen "$ip:0" --port-file "$EX_TMP/$1.port"
  ex_wait_file "$1" "$EX_TMP/$1.port" 20
  EX_ADDR="$1=$ip:$(ex_port "$EX_TMP/$1.port")"
}
worker encoder-0 encoder enc0 11
enc_list=$EX_ADDR
worker encoder-1 encoder enc1 12
enc_list+=",$EX_ADDR"
worker pd-0 pd pd0 13
pd_list=$EX_ADDR
worker pd-1 pd pd1 14
pd_list+=",$EX_ADDR"
ex_start proxy ip netns exec "$MH_PFX-fe" "$bin/ecs-example-proxy" --connector-config "$cfg" \
  --encoders "$enc_list" --pds "$pd_list" --listen "$(mh_ip 1):0" --port-file "$EX_TMP/proxy.port"
ex_wait_file proxy "$EX_TMP/proxy.port" 20

wl=(--requests "$requests" --images-per-request 1 --image-size "$image_size" --prompt-tokens "$prompt"
  --output-tokens "$output" --unique-images "$unique" --seed "$seed")
ex_run_fg ip netns exec "$MH_PFX-fe" "$bin/ecs-example-loadgen" --proxy "$(mh_ip 1):$(ex_port "$EX_TMP/proxy.port")" \
  "${wl[@]}" --concurrency "$conc" --label "2E2PD, four hosts" --tokens-out "$EX_TMP/tokens.txt" \
  --summary-out "$EX_TMP/summary.txt"
lrc=$EX_FG_RC
[ "$lrc" -eq 0 ] || [ "$lrc" -eq 3 ] || ex_die "the load generator failed (status $lrc)"

echo "== where the embeddings live (ecstore-cli --redis $redis --ns $ns stat, from the front end)"
ip netns exec "$MH_PFX-fe" "$bin/ecstore-cli" --redis "$redis" --ns "$ns" --timeout-ms 5000 stat |
  grep -E '^(server|  objects)' || true
ex_stop_all
ex_run_fg "$bin/ecs-example-reference" "${wl[@]}" --check "$EX_TMP/tokens.txt"
crc=$EX_FG_RC
if [ -n "$summary_out" ]; then
  cp "$EX_TMP/summary.txt" "$summary_out"
  if [ "$crc" -eq 0 ]; then echo "correctness=PASS"; else echo "correctness=FAIL"; fi >>"$summary_out"
fi
[ "$crc" -eq 0 ] || { echo "FAILED: the tokens differ from the single-process run (see above)" >&2; exit 1; }
[ "$lrc" -eq 0 ] || { echo "FAILED: some requests failed (see the report)" >&2; exit 1; }
if [ "$EX_STRICT" = 1 ] && [ "$EX_EXIT_BAD" = 1 ]; then
  echo "FAILED: a component exited with an error status (--strict)" >&2
  exit 1
fi
exit 0
