#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build, test and run
# ecstore.  Idempotent: quiet when everything is already there; otherwise it
# names what it installs.  Runs apt-get as root, or through sudo.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config
  libhiredis-dev libxxhash-dev libzstd-dev liblz4-dev libcmocka-dev
  libibverbs-dev librdmacm-dev
  redis-server redis-sentinel redis-tools
  python3 python3-venv
  python3-numpy python3-torch python3-pytest python3-redis
  clang libclang-rt-14-dev  # the libFuzzer targets (tests/fuzz/run.sh); the runtime is only recommended
)
# Extra packages for the benchmarks' plots and peers (ECS_DEPS_BENCH=1).
if [ "${ECS_DEPS_BENCH:-0}" = 1 ]; then
  pkgs+=(gnuplot-nox memcached)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
echo "install-deps: (a fresh Debian 12 machine: about 3.5 minutes; apt's downloads and set-ups follow)"
export DEBIAN_FRONTEND=noninteractive
echo "install-deps: apt-get update"
"${sudo[@]}" apt-get update -qq >/dev/null
# apt's own lines, one per package downloaded ("Get:N ...") and set up
# ("Setting up ..."), numbered against the count apt announces, are the
# progress; the rest of its output is dropped.
"${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}" 2>&1 |
  awk '
    / newly installed/ { n = $1 + $3; print "install-deps: " $0; fflush(); next }
    /^Get:/ { g++; printf "install-deps: download %d/%s: %s %s %s\n", g, n ? n : "?", $5, $(NF - 1), $NF; fflush(); next }
    /^Setting up / { u++; printf "install-deps: set up %d/%s: %s\n", u, n ? n : "?", $3; fflush(); next }
    /^(E|W): / { print; fflush() }
  '
# The Debian package starts a system redis on port 6379; ecstore's tests and
# examples start their own on free ports and never use it.
echo "install-deps: done"
