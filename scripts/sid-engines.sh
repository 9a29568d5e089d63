#!/usr/bin/env bash
# Fetches containerd 2 from Debian sid into .engines/sid/ (ignored by git) for the tests that
# need a containerd with NRI (tests/containerd2_e2e.rs): Debian 12's containerd is 1.6. The
# system's packages are left alone: apt runs with a private sources list, lists, cache and
# (empty) dpkg status, downloads the one .deb, and `dpkg -x` unpacks it. Debian 12's runc
# (/usr/sbin/runc) runs the containers; sid's runc needs a newer glibc and is not fetched.
#
# Which version: the containerd that sid has now, as long as it is a 2.x (it is printed and
# written to .engines/sid/version). deb.debian.org keeps only sid's current upload, so an exact
# pin would fail CI at sid's next containerd upload for no fault of the code. To pin anyway:
# NVHOOK_SID_CONTAINERD_VERSION=2.1.9+ds1-5 scripts/sid-engines.sh.
#
# Idempotent: once .engines/sid/version exists (and matches any pin) it does nothing.
# Any failure stops it with one line that names the cause: the tests never skip.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINES=$PWD/.engines
DEST=$ENGINES/sid
STAMP=$DEST/version
PIN=${NVHOOK_SID_CONTAINERD_VERSION:-}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
MIRROR=http://deb.debian.org/debian

fail() {
  echo "sid-engines: $*" >&2
  exit 1
}

current() {
  [ -s "$STAMP" ] && [ -x "$DEST/usr/bin/containerd" ] && { [ -z "$PIN" ] || [ "$(cat "$STAMP")" = "$PIN" ]; }
}

current && exit 0
mkdir -p "$ENGINES"
# One fetch at a time (two test runs may start together).
exec 9>"$ENGINES/sid.lock"
flock 9
current && exit 0

for program in apt-get apt-cache dpkg dpkg-deb; do
  command -v $program >/dev/null || fail "$program is missing: this script needs Debian's apt and dpkg"
done
[ -r "$KEYRING" ] || fail "$KEYRING is missing: apt-get install -y debian-archive-keyring"
started=$(date +%s)
APT=$ENGINES/sid-apt
rm -rf "$APT" "$DEST.new"
mkdir -p "$APT/lists/partial" "$APT/archives/partial" "$APT/cache" "$DEST.new"
arch=$(dpkg --print-architecture)
echo "deb [arch=$arch signed-by=$KEYRING target=Packages] $MIRROR sid main" >"$APT/sources.list"
: >"$APT/status"
# The system's apt.conf.d still applies (a proxy, for instance); every path apt writes is ours.
# As root apt downloads as _apt, which may not reach the project directory: stay root.
apt_options=(
  -o "Dir::Etc::sourcelist=$APT/sources.list" -o Dir::Etc::sourceparts=-
  -o "Dir::State::lists=$APT/lists" -o "Dir::State::status=$APT/status"
  -o "Dir::Cache=$APT/cache" -o "Dir::Cache::archives=$APT/archives"
  -o APT::Sandbox::User=root -o Debug::NoLocking=true
)
apt-get "${apt_options[@]}" -qq update >"$APT/update.log" 2>&1 ||
  fail "apt-get update of $MIRROR sid failed (network? see $APT/update.log): $(grep -m1 -E '^(E|W):' "$APT/update.log" || tail -1 "$APT/update.log")"
# apt-get update says only a warning, and succeeds, when it fetched nothing.
compgen -G "$APT/lists/*_Packages*" >/dev/null ||
  fail "apt-get update of $MIRROR sid fetched no package list (network? see $APT/update.log): $(grep -m1 -E '^(E|W):' "$APT/update.log" || tail -1 "$APT/update.log")"
candidate=$(apt-cache "${apt_options[@]}" policy containerd | awk '/Candidate:/ { print $2 }')
[ -n "$candidate" ] && [ "$candidate" != "(none)" ] || fail "Debian sid has no containerd package any more"
version=${PIN:-$candidate}
if [ -n "$PIN" ] && [ "$PIN" != "$candidate" ]; then
  fail "Debian sid has containerd $candidate, not the pinned NVHOOK_SID_CONTAINERD_VERSION=$PIN (deb.debian.org keeps only sid's current version): unset the pin or set it to $candidate"
fi
case $version in
  2.*) ;;
  *) fail "Debian sid has containerd $version, not a 2.x: the NRI tests are written for containerd 2 (set NVHOOK_SID_CONTAINERD_VERSION and adapt tests/support/src/engines.rs)" ;;
esac
(cd "$APT/archives" && apt-get "${apt_options[@]}" -qq download "containerd=$version") >"$APT/download.log" 2>&1 ||
  fail "apt-get download containerd=$version from $MIRROR sid failed: $(grep -m1 -E '^(E|W):' "$APT/download.log" || tail -1 "$APT/download.log")"
deb=$(ls "$APT"/archives/containerd_*.deb)
dpkg -x "$deb" "$DEST.new" || fail "dpkg -x $deb failed"
for program in containerd containerd-shim-runc-v2 ctr; do
  [ -x "$DEST.new/usr/bin/$program" ] || fail "containerd $version from sid has no usr/bin/$program"
done
said=$("$DEST.new/usr/bin/containerd" --version 2>&1) ||
  fail "sid's containerd $version does not run here: $said"
said=$(echo $said)
case $said in
  *" 2."*) ;;
  *) fail "sid's containerd $version says it is: $said" ;;
esac
echo "$version" >"$DEST.new/version"
rm -rf "$DEST"
mv "$DEST.new" "$DEST"
rm -rf "$APT"
echo "sid-engines: $said (Debian sid $version) in $DEST, fetched in $(($(date +%s) - started))s"
