#!/usr/bin/env bash
# Makes (once) the Python environment that ecstore's Python tests,
# benchmarks and examples run in, and prints its directory on stdout.
#
# It is a venv (Debian's system Python refuses `pip install`) holding the
# pinned PyPI packages of ec_connector/python/requirements-test.txt.  It is
# cached: its name carries a hash of that file and of the interpreter, so a
# second run downloads nothing and a changed pin makes a new environment.
#   ECS_PYENV_DIR     where environments live (default ~/.cache/ecstore)
#   ECS_PYENV_PYTHON  the interpreter to make it from (default python3)
#   ECS_PYENV_MIN_FREE_GB  free space required before starting (default 12)
# Progress goes to stderr; only the path goes to stdout:
#   py=$(scripts/pyenv.sh)/bin/python
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req=$root/ec_connector/python/requirements-test.txt
base=${ECS_PYENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ecstore}
py=${ECS_PYENV_PYTHON:-python3}

if ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "pyenv: $py cannot make a venv (Debian: apt-get install python3-venv;" \
       "scripts/install-deps.sh does it)" >&2
  exit 1
fi
tag=$( { cat "$req"; "$py" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-12)
env=$base/pyenv-$tag
mkdir -p "$base"

# One maker at a time (parallel test runs share the cache).
exec 9>"$base/.pyenv.lock"
flock 9
if [ -f "$env/.complete" ] && [ -x "$env/bin/python" ]; then
  echo "$env"
  exit 0
fi
rm -rf "$env"

# What it costs, measured (2026-11-27, a 2-core Debian 12 VM): the venv is
# 9.6 GB (torch with its CUDA libraries, triton, vLLM: vLLM's own
# requirements, which the Python tests import; PyPI has no CPU-only torch)
# and took 7 minutes on a fast network, 18 on a slower one.  pip's
# downloads pass through its cache and temp dir on top of that.
need_gb=${ECS_PYENV_MIN_FREE_GB:-12}
free_kb=$(df -Pk "$base" | awk 'NR == 2 { print $4 }')
if [ -n "$free_kb" ] && [ "$free_kb" -lt $((need_gb * 1024 * 1024)) ]; then
  echo "pyenv: refusing to start: $base has $((free_kb / 1024 / 1024)) GB free; the Python test venv" \
       "needs about $need_gb GB (9.6 GB installed, plus pip's downloads). Free some space, or set" \
       "ECS_PYENV_DIR to a directory on a disk with $need_gb GB free." >&2
  exit 1
fi
echo "pyenv: making $env from $req (first run only): about 9.6 GB on disk (${need_gb} GB free needed," \
     "$((free_kb / 1024 / 1024)) GB free) and 7 to 20 minutes, depending on the network;" \
     "pip's progress follows, and a line every 30 s" >&2
start=$(date +%s)
"$py" -m venv "$env" >&2
# A heartbeat while pip installs (unpacking torch and the CUDA libraries
# prints nothing for minutes): the venv's size so far.
# (Its sleep holds no pipe of the caller's, so that a killed heartbeat
# leaves nothing behind that keeps py=$(scripts/pyenv.sh) waiting.)
( while sleep 30 >/dev/null 2>&1 </dev/null; do
    echo "pyenv: $(( $(date +%s) - start )) s, $(du -sm "$env" 2>/dev/null | cut -f1) MB so far" >&2
  done ) >/dev/null &
beat=$!
trap 'kill "$beat" 2>/dev/null' EXIT
# pip's own lines (Collecting, Downloading NAME (SIZE), Installing ...);
# its progress bars when stderr is a terminal.
rc=0
"$env/bin/python" -m pip install --disable-pip-version-check -r "$req" >&2 || rc=$?
kill "$beat" 2>/dev/null
wait "$beat" 2>/dev/null || true
if [ "$rc" -ne 0 ]; then
  echo "pyenv: pip install failed (status $rc); $env is left incomplete and is made again on the next run" >&2
  exit "$rc"
fi
touch "$env/.complete"
echo "pyenv: ready in $(( $(date +%s) - start )) s, $(du -sh "$env" | cut -f1)" >&2
echo "$env"
