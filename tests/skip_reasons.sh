#!/bin/sh
# Every cmocka skip() in the C tests says why first: within the 3 lines
# before it, a print of "skip: ..." (scripts/test.sh's skip report shows that
# reason; a bare skip() showed as "(no reason printed)").
# usage: skip_reasons.sh SRC_DIR
src=${1:?usage: skip_reasons.sh SRC_DIR}
bad=$(awk '
  FNR == 1 { said = -10 }
  /"skip: / { said = FNR }
  /(^|[^_A-Za-z0-9])skip\(\);/ && FNR - said > 3 {
    printf "%s:%d: skip() without a \"skip: reason\" line before it\n", FILENAME, FNR
  }
' "$src"/tests/*.c "$src"/tests/support/*.c)
if [ -n "$bad" ]; then
  echo "$bad"
  exit 1
fi
echo "every skip() says why"
