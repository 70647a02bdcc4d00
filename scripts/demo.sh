#!/usr/bin/env bash
# The README's main command: installs what is missing, builds ecstore and
# runs the main job.  Options are passed through to the job.
set -euo pipefail
cd "$(dirname "$0")/.."
"$PWD/scripts/install-deps.sh"
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc 2>/dev/null || echo 2)" >/dev/null
exec build/bin/ecstore-bench pool "$@"
