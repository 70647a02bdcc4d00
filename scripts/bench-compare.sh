#!/usr/bin/env bash
# The side-by-side benchmark, end to end (docs/benchmarks.md):
#   1. installs what it needs and lacks (gnuplot-nox, memcached) through
#      ECS_DEPS_BENCH=1 scripts/install-deps.sh;
#   2. builds ecstore-bench, ecstore-server and the examples (tests off) in
#      the build directory;
#   3. runs `ecstore-bench compare` (default run <= ~5 minutes on 2 cores);
#   4. runs bench/bench_examples.sh --only-1e1pd (EC load latency of the
#      1E1PD example per backend, ~2 minutes) when it exists;
#   5. draws the PNG plots with gnuplot (bench/plot.gp).
#
#   scripts/bench-compare.sh [--quick] [--out DIR] [--img-dir DIR] [--build-dir DIR]
#                            [--no-examples] [--no-plots] [--no-deps] [-- compare options...]
#
#   --out DIR       tables and CSV (default BUILD/bench-compare)
#   --img-dir DIR   PNG plots (default: the --out directory; docs/img for the docs)
#   --quick         compare --quick (CI's harness check, < 30 s) and no examples
#
# Load matters: other builds and tests on the machine distort the figures.
# The script prints the load average before and after; compare.txt keeps it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

build="$repo/build-compare" out="" img="" quick=0 examples=1 plots=1 deps=1 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
  --help | -h)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  --out) out=$2; shift 2 ;;
  --img-dir) img=$2; shift 2 ;;
  --build-dir) build=$2; shift 2 ;;
  --quick) quick=1; examples=0; shift ;;
  --no-examples) examples=0; shift ;;
  --no-plots) plots=0; shift ;;
  --no-deps) deps=0; shift ;;
  --) shift; extra=("$@"); break ;;
  *) echo "bench-compare: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out="$build/bench-compare"
[ -n "$img" ] || img="$out"
mkdir -p "$out" "$img"
out=$(cd "$out" && pwd)
img=$(cd "$img" && pwd)

if [ "$deps" = 1 ]; then
  ECS_DEPS_BENCH=1 "$repo/scripts/install-deps.sh"
fi

echo "== build ($build)" >&2
cmake -S "$repo" -B "$build" -DECS_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target ecstore-bench ecstore-server >/dev/null
if [ "$examples" = 1 ] && ! cmake --build "$build" -j"$(nproc)" >"$build/bench-compare-build.log" 2>&1; then
  echo "bench-compare: the examples did not build ($build/bench-compare-build.log); no example figures" >&2
  examples=0
fi

echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
args=(compare --out "$out")
[ "$quick" = 1 ] && args+=(--quick)
"$build/bin/ecstore-bench" "${args[@]}" "${extra[@]}"

if [ "$examples" = 1 ]; then
  if [ -x "$repo/bench/bench_examples.sh" ]; then
    echo "== 1E1PD example, EC load latency per backend" >&2
    if "$repo/bench/bench_examples.sh" --only-1e1pd --build-dir "$build" --csv "$out/examples.csv" \
      >"$out/examples.txt"; then
      cat "$out/examples.txt"
    else
      echo "bench-compare: bench_examples.sh failed (see above); the compare figures stand" >&2
    fi
  else
    echo "bench-compare: bench/bench_examples.sh is not there; no example figures" >&2
  fi
fi
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

if [ "$plots" = 1 ]; then
  if command -v gnuplot >/dev/null 2>&1; then
    gnuplot -e "dir='$out'; img='$img'" "$repo/bench/plot.gp" 2> >(grep -v 'empty x range' >&2)
    echo "bench-compare: plots in $img" >&2
  else
    echo "bench-compare: gnuplot is missing (ECS_DEPS_BENCH=1 scripts/install-deps.sh); no plots" >&2
  fi
fi
echo "bench-compare: tables and CSV in $out" >&2
