#!/usr/bin/env bash
# 1E1PD: encoder worker(s) -> EC connector -> prefill+decode worker(s).
# Starts redis-server, ecstore-server, the workers, the proxy and the load
# generator on free ports in a temp dir, prints a serving-benchmark report,
# checks the tokens against a single-process run, and stops everything on
# success, failure or Ctrl-C.  --help lists the options; docs/examples.md
# explains the pieces.
set -euo pipefail
# shellcheck source=examples/lib/disagg.sh
. "$(dirname "$0")/lib/disagg.sh"
ex_main 1E1PD "$@"
