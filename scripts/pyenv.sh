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
echo "pyenv: making $env from $req (first run only; vLLM and torch are a few GB)" >&2
start=$(date +%s)
"$py" -m venv "$env" >&2
"$env/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >&2
touch "$env/.complete"
echo "pyenv: ready in $(( $(date +%s) - start )) s" >&2
echo "$env"
