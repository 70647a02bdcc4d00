#!/usr/bin/env bash
# The README's main command: installs what is missing, builds ecstore and
# runs the 1E1PD example (examples/disagg_1e1pd_example.sh: an encoder and a
# prefill/decode worker over the EC connector and ecstore-server, a serving
# report, and a token-by-token check against a single-process run).
# Options are passed through to the example (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
# Help first: asking what the options are must not install or build anything.
for a in "$@"; do
  case $a in
    -h | --help) exec examples/disagg_1e1pd_example.sh --help ;;
  esac
done
"$PWD/scripts/install-deps.sh"
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc 2>/dev/null || echo 2)" >/dev/null
exec examples/disagg_1e1pd_example.sh --build-dir "$PWD/build" "$@"
