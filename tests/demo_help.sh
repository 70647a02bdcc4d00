#!/bin/sh
# scripts/demo.sh checks its options before it installs or builds anything:
# --help prints the options, a wrong option is refused at once; and a good
# run builds only the example's programs.  cmake, apt-get and sudo are
# replaced by stand-ins that leave a mark (cmake: its arguments) and fail,
# dpkg-query by one that says every package is installed.
set -eu
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for tool in cmake apt-get sudo; do
  printf '#!/bin/sh\necho "$*" >>"%s/ran-%s"\nexit 99\n' "$tmp" "$tool" >"$tmp/$tool"
  chmod +x "$tmp/$tool"
done
printf '#!/bin/sh\nprintf "install ok installed"\n' >"$tmp/dpkg-query"
chmod +x "$tmp/dpkg-query"
ran() { ls "$tmp"/ran-* >/dev/null 2>&1; }

out=$(PATH="$tmp:$PATH" "$src/scripts/demo.sh" --help 2>&1) || {
  echo "demo.sh --help failed: $out"
  exit 1
}
case $out in
  usage:*) ;;
  *) echo "demo.sh --help did not start with its usage: $out"; exit 1 ;;
esac
if ran; then
  echo "demo.sh --help ran: $(ls "$tmp" | grep ran-)"
  exit 1
fi
echo "demo.sh --help: usage printed, nothing installed or built"

# Wrong options: refused with the reason and status 2, nothing run.
for bad in "--bogus" "--backend nope" "--requests" "--requests many" "--pool-size lots"; do
  rc=0
  # shellcheck disable=SC2086
  out=$(PATH="$tmp:$PATH" timeout 20 "$src/scripts/demo.sh" $bad 2>&1) || rc=$?
  if [ "$rc" != 2 ]; then
    echo "demo.sh $bad: exit $rc, expected 2: $out"
    exit 1
  fi
  case $out in
    error:*) ;;
    *) echo "demo.sh $bad: no 'error:' line: $out"; exit 1 ;;
  esac
  if ran; then
    echo "demo.sh $bad ran $(ls "$tmp" | grep ran-) before refusing the option"
    exit 1
  fi
  echo "demo.sh $bad: refused at once ($out)"
done

# Good options: it goes on to configure and build, only the example's
# programs (the cmake stand-in fails the configure step; a second one records
# the build's arguments).
rc=0
out=$(PATH="$tmp:$PATH" timeout 20 "$src/scripts/demo.sh" --requests 5 2>&1) || rc=$?
grep -q -- "--preset default" "$tmp/ran-cmake" || { echo "demo.sh did not configure: $out"; exit 1; }
rm -f "$tmp/ran-cmake"
printf '#!/bin/sh\necho "$*" >>"%s/ran-cmake"\nexit 0\n' "$tmp" >"$tmp/cmake"
out=$(PATH="$tmp:$PATH" timeout 20 "$src/scripts/demo.sh" --requests 5 --build-dir "$tmp/none" 2>&1) || true
build=$(grep -- "--build" "$tmp/ran-cmake" || true)
for t in ecstore-server ecs-example-worker ecs-example-proxy ecs-example-loadgen ecs-example-reference; do
  case " $build " in
    *" $t "*) ;;
    *) echo "demo.sh's build lacks --target $t: '$build'"; exit 1 ;;
  esac
done
case $build in
  *--target*) ;;
  *) echo "demo.sh builds everything: '$build'"; exit 1 ;;
esac
echo "demo.sh builds only: $build"
