#!/usr/bin/env bash
# The example scripts as tests (ctest label "examples"): each case runs
# examples/disagg_*_example.sh in a small configuration with real
# redis-server, ecstore-server and worker processes, and asserts on its
# exit status and report.
#
#   tests/test_examples.sh BUILD_DIR CASE
#
# Cases: 1e1pd-ecstore, 1e1p1d-ecstore-tcp, 1e1pd-disk, 1e1p1d-redis,
#        fault-server-down, fault-evict, fault-kv-timeout, multihost (root:
#        network namespaces; 77 elsewhere).
set -uo pipefail

build=${1:?usage: test_examples.sh BUILD_DIR CASE}
case_=${2:?usage: test_examples.sh BUILD_DIR CASE}
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp "${TMPDIR:-/tmp}/ecs-test-examples-XXXXXX")
trap 'rm -f "$out"' EXIT

# A small workload: 112x112 images (16 tokens x 2048 bf16 = 64 KiB each).
small=(--build-dir "$build" --requests 6 --image-size 112x112 --prompt-tokens 40 --output-tokens 8
  --concurrency 2 --strict)

fail() {
  echo "--- output of the run:"
  cat "$out"
  echo "FAIL ($case_): $*"
  exit 1
}

# run SCRIPT ARGS...: runs an example, keeps its output in $out and status in $rc.
run() {
  local script=$1
  shift
  echo "+ examples/$script $*"
  rc=0
  timeout 100 "$repo/examples/$script" "$@" >"$out" 2>&1 || rc=$?
}

# figure LABEL: the first number after "LABEL" in the report.
figure() {
  grep -F "$1" "$out" | head -n 1 | sed 's/.*: *//' | grep -oE '[0-9]+' | head -n 1
}

expect_pass() {
  [ "$rc" -eq 0 ] || fail "exit status $rc, expected 0"
  grep -q "^correctness: PASS" "$out" || fail "no 'correctness: PASS' line"
}

expect_no_failed() {
  [ "$(figure 'Failed requests:')" = 0 ] || fail "failed requests, expected none"
  [ "$(figure 'Successful requests:')" = 6 ] || fail "expected 6 successful requests"
}

case "$case_" in
1e1pd-ecstore)
  run disagg_1e1pd_example.sh "${small[@]}" --backend ecstore --protocol auto
  expect_pass
  expect_no_failed
  grep -q "backend/path: *ecstore/" "$out" || fail "no ecstore backend/path line"
  [ "$(figure 'Recomputed embeddings')" = 0 ] || fail "recomputes in a clean run"
  ;;
1e1p1d-ecstore-tcp)
  run disagg_1e1p1d_example.sh "${small[@]}" --backend ecstore --protocol tcp --prefills 2 --decodes 2
  expect_pass
  expect_no_failed
  grep -q "backend/path: *ecstore/tcp" "$out" || fail "path is not ecstore/tcp"
  grep -q "KV fetch latency" "$out" || fail "no KV handoff figures"
  ;;
1e1pd-disk)
  run disagg_1e1pd_example.sh "${small[@]}" --backend disk
  expect_pass
  expect_no_failed
  grep -q "backend/path: *disk/" "$out" || fail "path is not disk"
  ;;
1e1p1d-redis)
  run disagg_1e1p1d_example.sh "${small[@]}" --backend redis
  expect_pass
  expect_no_failed
  grep -q "backend/path: *redis/" "$out" || fail "path is not redis"
  ;;
fault-server-down)
  # ecstore-server stopped before the load: every save fails and is
  # reported; the PD worker misses and recomputes; the tokens still match.
  run disagg_1e1pd_example.sh "${small[@]}" --backend ecstore --fault server-down
  expect_pass
  expect_no_failed
  [ "$(figure 'Failed saves')" -gt 0 ] || fail "no failed saves reported"
  grep -q "Note (first):.*save of .* failed" "$out" || fail "the save failure's reason is not shown"
  [ "$(figure 'Recomputed embeddings')" = 6 ] || fail "expected all 6 embeddings recomputed"
  ;;
fault-evict)
  # a 1 MiB pool; after has() reports hits the proxy floods it, so the
  # hits are evicted before the load: a miss and a recompute, never garbage.
  run disagg_1e1pd_example.sh "${small[@]}" --backend ecstore --pool-size 1M --unique-images 2 \
    --concurrency 1 --fault evict
  expect_pass
  expect_no_failed
  [ "$(figure 'Images / cache hits')" = 6 ] || fail "images count"
  hits=$(grep -F 'Images / cache hits' "$out" | sed 's/.*: *//' | awk '{print $3}')
  [ "${hits:-0}" -gt 0 ] || fail "has() found no hits, so nothing was evicted after it"
  [ "$(figure 'Recomputed embeddings')" -gt 0 ] || fail "no recompute after the eviction"
  [ "$(figure 'Failed saves')" = 0 ] || fail "saves failed"
  ;;
fault-kv-timeout)
  # prefill stalls every 2nd request past decode's KV timeout: those
  # requests are aborted with the reason in the report; the rest match.
  run disagg_1e1p1d_example.sh "${small[@]}" --backend ecstore --kv-timeout-ms 800 --fault kv-stall \
    --allow-failures
  expect_pass
  [ "$(figure 'Failed requests:')" = 3 ] || fail "expected 3 failed requests"
  grep -q "^req-[0-9]*: decode .*KV fetch of req-[0-9]* failed.*ETIMEDOUT" "$out" ||
    fail "the report does not name the KV fetch timeout"
  grep -q "3 failed requests not compared" "$out" || fail "correctness line does not count the failures"
  # without --allow-failures the same run must fail loudly
  run disagg_1e1p1d_example.sh "${small[@]}" --backend ecstore --kv-timeout-ms 800 --fault kv-stall
  [ "$rc" -ne 0 ] || fail "a run with failed requests exited 0"
  grep -q "FAILED: some requests failed" "$out" || fail "no FAILED line"
  ;;
multihost)
  # 2E2PD on four simulated hosts (network namespaces): connectors given only
  # the Redis URL, encoders saving to their own host's server.
  run disagg_multihost_example.sh "${small[@]}"
  [ "$rc" -ne 77 ] || { echo "skip: needs root and network namespaces"; exit 77; }
  expect_pass
  expect_no_failed
  [ "$(figure 'Recomputed embeddings')" = 0 ] || fail "recomputes in a clean run"
  [ "$(figure 'Failed saves')" = 0 ] || fail "saves failed"
  grep -q "^server 10.77.0.11:7700" "$out" || fail "no per-server report"
  ;;
*)
  echo "unknown case $case_"
  exit 2
  ;;
esac
echo "PASS ($case_)"
