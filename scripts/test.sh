#!/usr/bin/env bash
# Builds ecstore twice (release with -Werror, then ASan+UBSan) and runs
# every test in both.  This is the README's test command and what CI runs.
#   scripts/test.sh            both builds
#   scripts/test.sh --fast     release build only
set -euo pipefail
cd "$(dirname "$0")/.."

"$PWD/scripts/install-deps.sh"
# The Python tests run in a venv with pinned PyPI packages (vLLM, torch,
# pytest), made on the first run and reused after (scripts/pyenv.sh).
pyenv=$("$PWD/scripts/pyenv.sh")

jobs=$(nproc 2>/dev/null || echo 2)
run_preset() {
  local preset=$1
  echo "== $preset: configure and build"
  cmake --preset "$preset" -DECS_PYTHON="$pyenv/bin/python" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  echo "== $preset: test"
  ctest --preset "$preset" -j "$jobs"
}

run_preset ci
if [ "${1:-}" != "--fast" ]; then
  run_preset asan
fi
echo "== all tests passed"
