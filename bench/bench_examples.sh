#!/usr/bin/env bash
# Runs both example pipelines (1E1PD, 1E1P1D) once per connector backend
# -- ecstore over tcp, ecstore over shm, disk, redis -- on the same
# workload, and prints their request and EC figures side by side, as a
# table and as CSV.
#
#   bench/bench_examples.sh [--build-dir DIR] [--csv FILE] [--only-1e1pd|--only-1e1p1d]
#                           [workload options of the example scripts...]
#
# Workload options (--requests, --image-size, --concurrency, ...) go to
# every run unchanged; the defaults are the examples' (100 requests, one
# 700x728 image each, 150 prompt + 100 output tokens).  Model compute is a
# stand-in; the EC figures are real (docs/examples.md).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

build_dir="" csv="" modes=(1e1pd 1e1p1d) pass=()
while [ $# -gt 0 ]; do
  case "$1" in
  --help | -h)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  --build-dir) build_dir=$2; shift 2 ;;
  --csv) csv=$2; shift 2 ;;
  --only-1e1pd) modes=(1e1pd); shift ;;
  --only-1e1p1d) modes=(1e1p1d); shift ;;
  *) pass+=("$1"); shift ;;
  esac
done
[ -n "$build_dir" ] && pass+=(--build-dir "$build_dir")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ecs-bench-examples-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

configs=("ecstore tcp" "ecstore shm" "disk -" "redis -")
rows=()
for mode in "${modes[@]}"; do
  for c in "${configs[@]}"; do
    read -r backend proto <<<"$c"
    shown=$backend
    [ "$proto" = - ] || shown+="/$proto"
    name="$mode-${shown//\//-}"
    args=(--backend "$backend")
    [ "$proto" = - ] || args+=(--protocol "$proto")
    echo "== $mode, backend $shown" >&2
    rc=0
    "$repo/examples/disagg_${mode}_example.sh" "${args[@]}" "${pass[@]}" --summary-out "$tmp/$name.txt" \
      >"$tmp/$name.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ] || [ ! -s "$tmp/$name.txt" ]; then
      echo "   run failed (status $rc); its output:" >&2
      tail -n 30 "$tmp/$name.log" >&2
      rows+=("$mode|$shown|FAILED")
      continue
    fi
    grep -E "^(Benchmark duration|Request throughput|Mean TTFT|EC load latency|correctness)" "$tmp/$name.log" |
      sed 's/^/   /' >&2
    rows+=("$mode|$name")
  done
done

# key=value summary -> one field
get() {
  grep -E "^$2=" "$tmp/$1.txt" | head -n 1 | cut -d= -f2-
}

fields=(path ok failed duration_s req_per_s ttft_mean_ms ttft_p99_ms tpot_mean_ms ec_save_p50_ms ec_save_p99_ms
  ec_load_p50_ms ec_load_p99_ms hit_rate recomputes load_mb kv_fetch_p50_ms kv_fetch_p99_ms correctness)
{
  echo "setup,$(
    IFS=,
    echo "${fields[*]}"
  )"
  for r in "${rows[@]}"; do
    IFS='|' read -r mode name extra <<<"$r"
    if [ "${extra:-}" = FAILED ]; then
      echo "$mode,$name,FAILED"
      continue
    fi
    line="$mode"
    for f in "${fields[@]}"; do line+=",$(get "$name" "$f")"; done
    echo "$line"
  done
} >"$tmp/all.csv"

echo
echo "Examples benchmark: $(uname -n), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ); workload: ${pass[*]:-defaults}"
echo "(model compute is a stand-in; the save/load latencies (ms), hits, recomputes and KV fetch (ms) are real"
echo " store figures; save = ecs_ec_save + wait_for_save per request, load = start_load -> wait_for_load)"
printf '%-7s %-12s %7s %6s %6s %8s %8s %7s %8s %8s %8s %8s %5s %6s %8s %8s %s\n' setup backend/path ok/fail \
  dur_s req/s TTFT_ms TTFT_p99 TPOT_ms save_p50 save_p99 load_p50 load_p99 hit% recomp KV_p50 KV_p99 check
tail -n +2 "$tmp/all.csv" | while IFS=, read -r mode path ok failed dur rps tm tp99 tpm s50 s99 e50 e99 hit rec _lmb k50 k99 corr; do
  if [ "$ok" = FAILED ]; then
    printf '%-7s %-12s %s\n' "$mode" "$path" "run FAILED"
    continue
  fi
  kv50=$k50 kv99=$k99
  [ "$mode" = 1e1p1d ] || { kv50=-; kv99=-; }
  printf '%-7s %-12s %7s %6.2f %6.2f %8.1f %8.1f %7.2f %8.2f %8.2f %8.2f %8.2f %5.1f %6s %8s %8s %s\n' \
    "$mode" "${path// (auto)/}" "$ok/$failed" "$dur" "$rps" "$tm" "$tp99" "$tpm" "$s50" "$s99" "$e50" "$e99" \
    "$(awk -v h="$hit" 'BEGIN{print h*100}')" "$rec" "$kv50" "$kv99" "$corr"
done
echo
echo "CSV:"
cat "$tmp/all.csv"
[ -z "$csv" ] || cp "$tmp/all.csv" "$csv"
if grep -q FAILED "$tmp/all.csv"; then
  exit 1
fi
