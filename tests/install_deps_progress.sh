#!/bin/sh
# scripts/install-deps.sh shows apt's progress: what it installs, then one
# numbered line per package downloaded and set up (it was silent for the
# ~3.5 minutes of a fresh machine).  dpkg-query, apt-get and sudo are
# stand-ins: two packages missing, apt-get printing what apt prints.
set -eu
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/dpkg-query" <<'EOS'
#!/bin/sh
for a; do p=$a; done
case $p in
  cmake | redis-tools) printf 'unknown ok not-installed' ;;
  *) printf 'install ok installed' ;;
esac
EOS
cat >"$tmp/apt-get" <<'EOS'
#!/bin/sh
case " $* " in
  *" update "*) exit 0 ;;
esac
cat <<'EOT'
Reading package lists...
Building dependency tree...
The following NEW packages will be installed:
  cmake cmake-data redis-tools
0 upgraded, 3 newly installed, 0 to remove and 0 not upgraded.
Need to get 12.3 MB of archives.
Get:1 http://deb.debian.org/debian bookworm/main amd64 cmake-data all 3.25.1-1 [2026 kB]
Get:2 http://deb.debian.org/debian bookworm/main amd64 cmake amd64 3.25.1-1 [8692 kB]
Get:3 http://deb.debian.org/debian bookworm/main amd64 redis-tools amd64 5:7.0.15-1 [989 kB]
Unpacking cmake-data (3.25.1-1) ...
Setting up cmake-data (3.25.1-1) ...
Setting up cmake (3.25.1-1) ...
Setting up redis-tools (5:7.0.15-1) ...
EOT
EOS
printf '#!/bin/sh\nexec "$@"\n' >"$tmp/sudo"
chmod +x "$tmp/dpkg-query" "$tmp/apt-get" "$tmp/sudo"
out=$(PATH="$tmp:$PATH" "$src/scripts/install-deps.sh" 2>&1)
echo "$out"
for want in "install-deps: installing cmake redis-tools" \
  "install-deps: 0 upgraded, 3 newly installed" \
  "install-deps: download 1/3: cmake-data [2026 kB]" \
  "install-deps: download 3/3: redis-tools [989 kB]" \
  "install-deps: set up 2/3: cmake" \
  "install-deps: set up 3/3: redis-tools" \
  "install-deps: done"; do
  case $out in
    *"$want"*) ;;
    *) echo "FAIL: no line '$want'"; exit 1 ;;
  esac
done
echo "ok: apt's progress shown"
