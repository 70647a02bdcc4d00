#!/bin/sh
# scripts/demo.sh --help prints the options and exits, before it installs
# or builds anything: cmake and apt-get are replaced by stand-ins that leave
# a mark if they are ever run.
set -eu
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for tool in cmake apt-get sudo; do
  printf '#!/bin/sh\ntouch "%s/ran-%s"\nexit 99\n' "$tmp" "$tool" >"$tmp/$tool"
  chmod +x "$tmp/$tool"
done
out=$(PATH="$tmp:$PATH" "$src/scripts/demo.sh" --help 2>&1) || {
  echo "demo.sh --help failed: $out"
  exit 1
}
case $out in
  usage:*) ;;
  *) echo "demo.sh --help did not start with its usage: $out"; exit 1 ;;
esac
if ls "$tmp"/ran-* >/dev/null 2>&1; then
  echo "demo.sh --help ran: $(ls "$tmp" | grep ran-)"
  exit 1
fi
echo "demo.sh --help: usage printed, nothing installed or built"
