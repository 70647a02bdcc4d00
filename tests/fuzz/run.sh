#!/usr/bin/env bash
# Builds the libFuzzer targets (the fuzz preset, build-fuzz/) when needed
# and runs each on a copy of its committed seed corpus for a bounded time.
# Fails on any crash, leak, timeout, out-of-memory or broken invariant;
# prints one summary line per target (runs, coverage, corpus size).
#
#   tests/fuzz/run.sh                     every target, 20 s each
#   tests/fuzz/run.sh -t 300 fuzz_json    one target for 5 minutes
#   tests/fuzz/run.sh --gen-seeds         rewrite the generated seeds (gen-*)
#   tests/fuzz/run.sh --keep DIR          keep each run's grown corpus in DIR/<target>
#
# Exits 77 (skipped) when clang or its libFuzzer runtime is not installed.
# A crash leaves its input in build-fuzz/artifacts/; reproduce with
#   build-fuzz/bin/<target> build-fuzz/artifacts/<file>
# and, once fixed, commit it under tests/fuzz/corpus/<target>/ (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

secs=${ECS_FUZZ_SECONDS:-20}
keep=""
gen=0
targets=()
while [ $# -gt 0 ]; do
  case $1 in
  -t) secs=$2; shift 2 ;;
  --keep) keep=$2; shift 2 ;;
  --gen-seeds) gen=1; shift ;;
  -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  *) targets+=("$1"); shift ;;
  esac
done
all=(fuzz_server_request fuzz_client_reply fuzz_config fuzz_json fuzz_redis_record fuzz_ec_config fuzz_redis_url)
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")

# clang and libFuzzer (Debian: clang and libclang-rt-N-dev, which
# scripts/install-deps.sh installs); without them this is a skip, not a failure.
if ! command -v clang >/dev/null 2>&1; then
  echo "skip: clang is not installed (scripts/install-deps.sh installs it)"
  exit 77
fi
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' |
  clang -x c -fsanitize=fuzzer,address,undefined -o /dev/null - >/dev/null 2>&1; then
  echo "skip: clang cannot link a libFuzzer target (libclang_rt.fuzzer missing: scripts/install-deps.sh installs it)"
  exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== fuzz: configure and build (build-fuzz)"
if ! { cmake --preset fuzz && cmake --build --preset fuzz -j "$(nproc 2>/dev/null || echo 2)"; } >"$work/build.log" 2>&1; then
  tail -n 40 "$work/build.log"
  echo "== fuzz: the fuzz build failed (above)"
  exit 1
fi
bin=build-fuzz/bin
if [ $gen = 1 ]; then
  "$bin/fuzz_gen_seeds" tests/fuzz/corpus
  echo "seeds written under tests/fuzz/corpus/*/gen-*"
  exit 0
fi

arts=build-fuzz/artifacts
mkdir -p "$arts"
failed=()
for t in "${targets[@]}"; do
  if [ ! -x "$bin/$t" ] || [ ! -d "tests/fuzz/corpus/$t" ]; then
    echo "run.sh: no target $t (have: ${all[*]})" >&2
    exit 2
  fi
  corpus="$work/$t"
  mkdir -p "$corpus"
  cp tests/fuzz/corpus/"$t"/* "$corpus"/
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  # -timeout: one input may take 10 s at most; -error_exitcode=1: a crash is
  # not confused with 77, the skip; -rss_limit_mb and
  # -malloc_limit_mb: a hostile size must not turn into a huge allocation;
  # leaks are checked (ASan's LeakSanitizer) at the end of every input.
  rc=0
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$bin/$t" -max_total_time="$secs" -timeout=10 -error_exitcode=1 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -print_final_stats=1 -artifact_prefix="$arts/$t-" "${dict[@]}" "$corpus" >"$work/$t.log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -n 1) || true
  cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$work/$t.log" | tail -n 1) || true
  files=$(find "$corpus" -type f | wc -l)
  if [ $rc -ne 0 ]; then
    echo "FAIL $t: exit $rc after ${runs:-?} runs; the end of its log:"
    if grep -qE 'ERROR|SUMMARY|invariant|runtime error' "$work/$t.log"; then
      grep -E 'ERROR|SUMMARY|invariant|runtime error|Test unit written|^    #[0-9]' "$work/$t.log" | head -n 30
    else
      tail -n 30 "$work/$t.log"
    fi
    failed+=("$t")
  else
    echo "ok   $t: ${runs:-?} runs in ${secs}s, ${cov:-cov ?}, corpus $files files"
  fi
  if [ -n "$keep" ]; then
    mkdir -p "$keep/$t"
    cp "$corpus"/* "$keep/$t"/
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "== fuzz: FAILED: ${failed[*]} (inputs in $arts/)"
  exit 1
fi
echo "== fuzz: all ${#targets[@]} targets ran clean"
