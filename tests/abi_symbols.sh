#!/bin/sh
# The public ABI is the headers: libecstore.so must export exactly the
# functions declared in include/ecstore/*.h, and each of those declarations
# must carry ECS_API (the library is built with hidden visibility, so an
# unmarked declaration would be missing from the .so).
#
# usage: abi_symbols.sh LIBECSTORE_SO INCLUDE_DIR
set -eu
lib=$1
inc=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Function declarations start a line: [ECS_API] type [*]ecs_name(
decl='^(ECS_API )?(const |unsigned |struct )?[a-z_0-9]+[ *]+[*]*ecs_[a-z_0-9]+\('
grep -hE "$decl" "$inc"/*.h | sed -E 's/\(.*//; s/.*[ *]//' | sort -u >"$tmp/declared"
grep -hE "$decl" "$inc"/*.h | grep '^ECS_API ' | sed -E 's/\(.*//; s/.*[ *]//' | sort -u >"$tmp/marked"
nm -D --defined-only "$lib" | awk '{print $NF}' | sort -u >"$tmp/exported"

status=0
if [ ! -s "$tmp/declared" ]; then
  echo "abi: no declarations found in $inc (the pattern is broken)"
  exit 1
fi
if ! cmp -s "$tmp/declared" "$tmp/marked"; then
  echo "abi: declared in $inc but not marked ECS_API:"
  comm -23 "$tmp/declared" "$tmp/marked" | sed 's/^/  /'
  status=1
fi
if ! cmp -s "$tmp/declared" "$tmp/exported"; then
  echo "abi: exported by $(basename "$lib") but not declared in the public headers:"
  comm -13 "$tmp/declared" "$tmp/exported" | sed 's/^/  /'
  echo "abi: declared in the public headers but not exported:"
  comm -23 "$tmp/declared" "$tmp/exported" | sed 's/^/  /'
  status=1
fi
[ $status -eq 0 ] && echo "abi: $(wc -l <"$tmp/exported") symbols exported, each declared ECS_API in $inc"
exit $status
