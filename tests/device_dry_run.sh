#!/usr/bin/env bash
# scripts/device-check.sh --dry-run --quick against this build: the bundle
# is made (a 'bundle: DIR' line), the GPU steps are said to be skipped, every
# other step runs on this machine's cores, the last line starts with
# 'device-check:' and says ok, and $OUT holds the table, the log and the raw
# numbers (rows of each scaling step).  The figures are not checked: they
# are a smoke test of the harness on a busy 2-core machine.
#
# usage: tests/device_dry_run.sh BUILD_DIR [PYTHON]
set -u
BUILD=${1:?usage: device_dry_run.sh BUILD_DIR [PYTHON]}
SRC=$(cd "$(dirname "$0")/.." && pwd)
# The device runs release binaries; a sanitizer build's libecstore.so cannot
# be loaded into a plain Python (the ASan runtime must come first), so the
# CUDA plumbing step would abort.  The release build runs this test.
if ldd "$BUILD/bin/ecstore-server" | grep -q -E 'lib(asan|tsan|ubsan)'; then
  echo "skip: a sanitizer build (the bundle carries release binaries; its libecstore.so cannot load into plain python)"
  exit 77
fi
T=$(mktemp -d /tmp/ecs-dryrun-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() {
  echo "FAIL: $*"
  tail -n 40 "$T/run.log"
  exit 1
}
[ -n "${2:-}" ] && export ECS_DEVICE_PYTHON=$2
ECS_DEVICE_BUILD=$BUILD ECS_DEVICE_BUNDLE=$T/bundle OUT=$T/out \
  timeout 500 "$SRC/scripts/device-check.sh" --dry-run --quick --no-build >"$T/run.log" 2>&1
rc=$?
grep -qx "bundle: $T/bundle" "$T/run.log" || fail "no 'bundle: DIR' line"
grep -q "no GPU: CUDA checks skipped" "$T/run.log" || fail "no 'no GPU: CUDA checks skipped' line"
# the --cuda-register server without a GPU: /metrics and STAT both say 0
grep -q "server /metrics: ecstore_pool_cuda_registered 0" "$T/run.log" || fail "no /metrics cuda line saying 0"
grep -q "server STAT (ecstore-cli stat --json): pool_cuda_registered false" "$T/run.log" ||
  fail "no STAT cuda line saying false"
last=$(tail -n 1 "$T/run.log")
case $last in
device-check:\ ok:*) ;;
*) fail "rc $rc, last line: $last" ;;
esac
[ "$rc" = 0 ] || fail "rc $rc with an ok last line"
for f in device-check.md device-check.log raw.csv; do
  [ -s "$T/out/$f" ] || fail "$f not written to \$OUT"
done
for s in big small shm located; do
  grep -q "^$s," "$T/out/raw.csv" || fail "raw.csv has no rows of step '$s'"
done
grep -q "^## Targets" "$T/out/device-check.md" || fail "device-check.md has no targets table"
n=$(ls "$T/out" | wc -l)
[ "$n" -le 8 ] || fail "$n files in \$OUT (the device run brings back 8 at most)"
if grep -q "device_cuda.py --device cpu (at most" "$T/run.log"; then
  [ -s "$T/out/cuda.json" ] || fail "device_cuda.py ran but wrote no cuda.json"
  grep -q '"ok": true' "$T/out/cuda.json" || fail "device_cuda.py's plumbing check failed: $(cat "$T/out/cuda.json")"
  # the connector's save and load must have run (on the stand-in base), not
  # been reported "not available" or failed to import
  grep -q '"result": "ok: ' "$T/out/cuda.json" || fail "the connector's save/load did not run: $(cat "$T/out/cuda.json")"
  # ... and its staged load (tcp): every item staged, handed over, right
  python3 - "$T/out/cuda.json" <<'PYEOF' || fail "the connector's staged load did not run right: $(cat "$T/out/cuda.json")"
import json, sys
c = json.load(open(sys.argv[1]))["connector"]["load_staged"]
sys.exit(0 if c["staged"] > 0 and c["failed"] == 0 and c["wrong_bytes"] == 0 else 1)
PYEOF
  echo "device_cuda.py (CPU plumbing) ok"
fi
echo "ok: $last"
