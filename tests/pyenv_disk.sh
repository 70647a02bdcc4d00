#!/bin/sh
# scripts/pyenv.sh checks the free disk before it makes the venv, and
# refuses with the numbers and the way out instead of failing half-way
# through 9.6 GB: asked for more free space than any disk has
# (ECS_PYENV_MIN_FREE_GB), it exits 1 at once with that message and makes
# nothing.  pip is pointed at a dead index so that a run that goes past the
# check ends quickly instead of downloading.
set -u
src=${1:?usage: pyenv_disk.sh SRC_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
out=$(ECS_PYENV_DIR="$tmp" ECS_PYENV_MIN_FREE_GB=1000000 PIP_INDEX_URL=http://127.0.0.1:9/simple \
  PIP_RETRIES=0 PIP_TIMEOUT=2 timeout 60 "$src/scripts/pyenv.sh" 2>&1) || rc=$?
echo "$out"
[ "$rc" = 1 ] || { echo "FAIL: exit $rc, expected 1"; exit 1; }
case $out in
  *"pyenv: refusing to start: $tmp has "*" GB free; the Python test venv needs about 1000000 GB"*"set ECS_PYENV_DIR"*) ;;
  *) echo "FAIL: no refusal naming the free space and ECS_PYENV_DIR"; exit 1 ;;
esac
if ls -d "$tmp"/pyenv-* >/dev/null 2>&1; then
  echo "FAIL: a venv was started: $(ls "$tmp")"
  exit 1
fi
echo "ok: refused before making anything"
