#!/usr/bin/env bash
# Fetches containerd 2 and Docker (28 or 29) from Debian sid into .engines/sid/ (ignored by git) for
# the tests that need a containerd with NRI (tests/containerd2_e2e.rs; Debian 12's containerd is
# 1.6) and a current dockerd (tests/gpu_flags_e2e.rs; Debian 12's is 20.10). The system's
# packages are left alone: apt runs with a private sources list, lists, cache and (empty) dpkg
# status, downloads the .debs (containerd, docker.io, docker-cli), and `dpkg -x` unpacks them.
# Debian 12's runc (/usr/sbin/runc) runs the containers; sid's runc needs a newer glibc and is
# not fetched. sid's dockerd runs sid's containerd (the tests put it first on dockerd's PATH).
#
# Which versions: the containerd and docker.io that sid has now, as long as they are a 2.x and
# a 28.x or 29.x (tests/gpu_flags_e2e.rs expects the `--gpus` route moby's source gives each
# release; printed and written to .engines/sid/version and .engines/sid/docker-version).
# Debian's mirror keeps only sid's current upload, so an exact pin would fail CI at sid's next
# upload for no fault of the code. To pin anyway: NVHOOK_SID_CONTAINERD_VERSION=2.1.9+ds1-5,
# NVHOOK_SID_DOCKER_VERSION=28.5.2+dfsg4-5.
#
# Idempotent: once both stamps exist (and match any pins) it does nothing.
# Any failure stops it with one line that names the cause: the tests never skip.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/sid-apt.sh

ENGINES=$PWD/.engines
DEST=$ENGINES/sid
STAMP=$DEST/version
DOCKER_STAMP=$DEST/docker-version
PIN=${NVHOOK_SID_CONTAINERD_VERSION:-}
DOCKER_PIN=${NVHOOK_SID_DOCKER_VERSION:-}

fail() {
  echo "sid-engines: $*" >&2
  exit 1
}

current() {
  [ -s "$STAMP" ] && [ -x "$DEST/usr/bin/containerd" ] && { [ -z "$PIN" ] || [ "$(cat "$STAMP")" = "$PIN" ]; } &&
    [ -s "$DOCKER_STAMP" ] && [ -x "$DEST/usr/sbin/dockerd" ] && { [ -z "$DOCKER_PIN" ] || [ "$(cat "$DOCKER_STAMP")" = "$DOCKER_PIN" ]; }
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
started=$(date +%s)
APT=$ENGINES/sid-apt
rm -rf "$DEST.new"
mkdir -p "$DEST.new"
sid_apt "$APT"
# The version of `package` to fetch: sid's candidate, which must match the pin if one is set
# and start with one of `majors` (a space-separated list).
version_of() {
  local package=$1 pin=$2 pin_name=$3 majors=$4 candidate major
  candidate=$(apt-cache "${sid_apt_options[@]}" policy "$package" | awk '/Candidate:/ { print $2 }')
  [ -n "$candidate" ] && [ "$candidate" != "(none)" ] || fail "Debian sid has no $package package any more"
  if [ -n "$pin" ] && [ "$pin" != "$candidate" ]; then
    fail "Debian sid has $package $candidate, not the pinned $pin_name=$pin (Debian's mirror keeps only sid's current version): unset the pin or set it to $candidate"
  fi
  for major in $majors; do
    case $candidate in
      "$major".*)
        echo "$candidate"
        return
        ;;
    esac
  done
  fail "Debian sid has $package $candidate, not a ${majors// /.x or }.x: the tests are written for those (set $pin_name and adapt tests/support/src/engines.rs)"
}
version=$(version_of containerd "$PIN" NVHOOK_SID_CONTAINERD_VERSION 2)
docker_version=$(version_of docker.io "$DOCKER_PIN" NVHOOK_SID_DOCKER_VERSION "28 29")
# docker-cli is built from the same source package, at the same version.
wanted=("containerd=$version" "docker.io=$docker_version" "docker-cli=$docker_version")
(cd "$APT/archives" && apt-get "${sid_apt_options[@]}" -qq download "${wanted[@]}") >"$APT/download.log" 2>&1 ||
  fail "apt-get download ${wanted[*]} from $SID_MIRROR sid failed: $(grep -m1 -E '^(E|W):' "$APT/download.log" || tail -1 "$APT/download.log")"
for deb in "$APT"/archives/*.deb; do
  dpkg -x "$deb" "$DEST.new" || fail "dpkg -x $deb failed"
done
for program in bin/containerd bin/containerd-shim-runc-v2 bin/ctr sbin/dockerd bin/docker; do
  [ -x "$DEST.new/usr/$program" ] || fail "Debian sid's packages (${wanted[*]}) have no usr/$program"
done
said=$("$DEST.new/usr/bin/containerd" --version 2>&1) ||
  fail "sid's containerd $version does not run here: $said"
said=$(echo $said)
case $said in
  *" 2."*) ;;
  *) fail "sid's containerd $version says it is: $said" ;;
esac
# Built against sid's glibc: it must run with this system's.
docker_said=$("$DEST.new/usr/sbin/dockerd" --version 2>&1) ||
  fail "sid's dockerd $docker_version does not run here: $docker_said"
case $docker_said in
  "Docker version 28."* | "Docker version 29."*) ;;
  *) fail "sid's dockerd $docker_version says it is: $docker_said" ;;
esac
echo "$version" >"$DEST.new/version"
echo "$docker_version" >"$DEST.new/docker-version"
rm -rf "$DEST"
mv "$DEST.new" "$DEST"
rm -rf "$APT"
echo "sid-engines: $said (Debian sid $version), $docker_said (Debian sid $docker_version) in $DEST, fetched in $(($(date +%s) - started))s"
