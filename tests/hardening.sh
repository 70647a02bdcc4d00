#!/bin/sh
# The built binaries carry the hardening CMakeLists.txt asks for (README,
# "Security"): full RELRO (a GNU_RELRO segment and BIND_NOW), a PIE
# executable (ELF type DYN), stack canaries (__stack_chk_fail referenced)
# and, unless the third argument is "nofortify" (the ASan build, which
# replaces those calls), FORTIFY's checked calls (__*_chk).
#   hardening.sh EXECUTABLE SHARED_LIB [fortify|nofortify]
set -u
exe=$1 lib=$2 fortify=${3:-fortify}
command -v readelf >/dev/null 2>&1 || { echo "readelf not found (binutils): skipped"; exit 77; }
fail=0
bad() { echo "FAIL: $*"; fail=1; }

readelf -h "$exe" | grep -q 'Type:[[:space:]]*DYN' || bad "$exe is not a PIE (ELF type is not DYN)"
for f in "$exe" "$lib"; do
  readelf -lW "$f" | grep -q 'GNU_RELRO' || bad "$f has no GNU_RELRO segment"
  readelf -dW "$f" | grep -Eq '\(BIND_NOW\)|\(FLAGS\).*BIND_NOW|\(FLAGS_1\).*NOW' ||
    bad "$f is not linked with -z now (no BIND_NOW): partial RELRO only"
  readelf -sW --dyn-syms "$f" | grep -q '__stack_chk_fail' || bad "$f references no __stack_chk_fail: no stack protector"
  if [ "$fortify" = fortify ]; then
    readelf -sW --dyn-syms "$f" | grep -Eq '__[a-z_]+_chk(@|[[:space:]]|$)' ||
      bad "$f calls no __*_chk function: _FORTIFY_SOURCE is off"
  fi
done
[ $fail = 0 ] && echo "hardening: $exe and $lib OK ($fortify)"
exit $fail
