#!/usr/bin/env bash
# The README's main command: installs what is missing, builds ecstore and
# runs the 1E1PD example (examples/disagg_1e1pd_example.sh: an encoder and a
# prefill/decode worker over the EC connector and ecstore-server, a serving
# report, and a token-by-token check against a single-process run).
# Options are passed through to the example (--help lists them).
#
# On a fresh Debian 12 machine the first run takes about 6 minutes before
# the example starts: about 3.5 to install the packages (apt) and about 2 to
# build the five programs the example runs; later runs install nothing and
# rebuild only what changed.  Each step says what it is doing.
set -euo pipefail
cd "$(dirname "$0")/.."
ex=examples/disagg_1e1pd_example.sh
# Options first: --help, and a wrong option, must answer at once, before
# anything is installed or built.
for a in "$@"; do
  case $a in
    -h | --help) exec "$ex" --help ;;
  esac
done
"$ex" --check-options "$@" || exit $?

step() { echo "== demo: $*" >&2; }
step "checking the Debian packages (scripts/install-deps.sh; a fresh machine: about 3.5 minutes of apt)"
"$PWD/scripts/install-deps.sh"

# Only what the example runs, not every test and benchmark.
targets=(ecstore-server ecs-example-worker ecs-example-proxy ecs-example-loadgen ecs-example-reference)
log=$(mktemp "${TMPDIR:-/tmp}/ecs-demo-build-XXXXXX.log")
trap 'rm -f "$log"' EXIT
step "configuring (cmake --preset default)"
if ! cmake --preset default >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
step "building ${targets[*]} (a fresh build: about 2 minutes; make's percentages follow)"
# make's "[ NN%]" lines are the progress; the whole output goes to the log,
# which is shown if the build fails.
rc=0
cmake --build --preset default -j "$(nproc 2>/dev/null || echo 2)" --target "${targets[@]}" 2>&1 |
  tee "$log" | awk '/^\[ *[0-9]+%\] (Building|Linking)/ { print "   " $0; fflush() }' >&2 || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "demo: the build failed; its output:" >&2
  tail -n 60 "$log" >&2
  exit 1
fi
rm -f "$log"
step "running $ex"
exec "$ex" --build-dir "$PWD/build" "$@"
