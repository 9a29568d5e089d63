#!/usr/bin/env bash
# Builds the Rust OCI runtime youki from crates.io into .engines/youki/ (ignored by git), for the
# tests that run nvhook's hook and shim under a runtime other than runc and crun:
# .engines/youki/bin/youki.
#
# Which build: youki's crate has no default features, and a youki built without v1/v2 has no
# cgroup manager and refuses to create a container. Features: v1 and v2 (cgroupfs on either
# hierarchy), systemd (--systemd-cgroup on v2, youki's own D-Bus client: no libdbus), seccomp
# (else youki ignores linux.seccomp with a warning) and cgroupsv2_devices (else youki ignores
# linux.resources.devices on cgroup v2: no eBPF device program, every node open). seccomp links
# the system's libseccomp (Debian 12: libseccomp-dev); cgroupsv2_devices builds libbpf, which
# needs the libelf and zlib headers (libelf-dev, zlib1g-dev) and make.
# --locked: youki's own Cargo.lock, so the build is the same every time.
#
# Also .engines/youki/bin/youki-memlock: youki with lib/memlock.so preloaded. On cgroup v2
# youki raises RLIMIT_MEMLOCK to 128 MiB before it loads its device program and gives up when
# it cannot ("bpf error: Failed to increase rlimit"); without CAP_SYS_RESOURCE and under a
# smaller hard limit (this sandbox: 8 MiB) every v2 container fails. Since Linux 5.11 BPF is
# charged to the memory cgroup, not to that limit: memlock.so turns that one refused raise
# (EPERM on RLIMIT_MEMLOCK) into success, and nothing else. The youki binary itself is as built.
#
# Idempotent: once .engines/youki/bin/youki says it is the pinned version, built with these
# features (stamp .engines/youki/features), it is not built again; nor is memlock.so once there.
# Any failure stops it with one line that names the cause: the tests never skip.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.7.0
FEATURES=v1,v2,systemd,seccomp,cgroupsv2_devices
ENGINES=$PWD/.engines
DEST=$ENGINES/youki
YOUKI=$DEST/bin/youki
STAMP=$DEST/features
MEMLOCK=$DEST/lib/memlock.so
WRAPPER=$DEST/bin/youki-memlock
LOG=$ENGINES/youki-install.log

fail() {
  echo "youki: $*" >&2
  exit 1
}

# The first line of `youki --version`, read whole: youki panics when its stdout closes early.
version_of() {
  local said
  said=$("$1" --version 2>&1) || return 1
  echo "${said%%$'\n'*}"
}

youki_current() {
  [ -x "$YOUKI" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$FEATURES" ] &&
    [ "$(version_of "$YOUKI")" = "youki version: $VERSION" ]
}

memlock_current() {
  [ -s "$MEMLOCK" ] && [ -x "$WRAPPER" ]
}

youki_current && memlock_current && exit 0
mkdir -p "$ENGINES"
# One build at a time (two test runs may start together).
exec 9>"$ENGINES/youki.lock"
flock 9

missing=()
for program in cc make pkg-config; do
  command -v $program >/dev/null || missing+=("$program")
done
[ ${#missing[@]} -eq 0 ] || fail "missing ${missing[*]}: apt-get install -y gcc make pkg-config"

if ! youki_current; then
  command -v cargo >/dev/null || fail "cargo is missing: install Rust (rustup.rs, or Debian's cargo)"
  missing=()
  for library in libseccomp:libseccomp-dev libelf:libelf-dev zlib:zlib1g-dev; do
    pkg-config --exists "${library%%:*}" || missing+=("${library#*:}")
  done
  [ ${#missing[@]} -eq 0 ] || fail "youki $VERSION (features $FEATURES) needs the headers of ${missing[*]}: apt-get install -y ${missing[*]}"
  started=$(date +%s)
  rm -rf "$DEST.new"
  mkdir -p "$DEST.new"
  # A target directory of its own, removed afterwards (cargo's default is a temporary one
  # under TMPDIR, which may be small).
  TARGET=$ENGINES/youki-target
  rm -rf "$TARGET"
  CARGO_TARGET_DIR=$TARGET cargo install --quiet --locked --root "$DEST.new" \
    --no-default-features --features "$FEATURES" youki --version "=$VERSION" >"$LOG" 2>&1 ||
    fail "cargo install youki $VERSION --features $FEATURES failed (see $LOG): $(grep -m1 -E '^error' "$LOG" || tail -1 "$LOG")"
  rm -rf "$TARGET"
  [ -x "$DEST.new/bin/youki" ] || fail "cargo install youki $VERSION left no $DEST.new/bin/youki (see $LOG)"
  said=$("$DEST.new/bin/youki" --version 2>&1) || fail "the youki just built does not run: $(echo $said)"
  [ "${said%%$'\n'*}" = "youki version: $VERSION" ] || fail "the youki just built says it is: $(echo $said)"
  echo "$FEATURES" >"$DEST.new/features"
  rm -rf "$DEST"
  mv "$DEST.new" "$DEST"
  rm -f "$LOG"
  echo "youki: youki $VERSION (features $FEATURES) in $DEST, $(du -h "$YOUKI" | cut -f1) binary, built in $(($(date +%s) - started))s"
fi

if ! memlock_current; then
  mkdir -p "$DEST/lib"
  cc -shared -fPIC -O2 -o "$MEMLOCK.new" -x c - -ldl >"$LOG" 2>&1 <<'C' ||
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/resource.h>
/* A refused raise of RLIMIT_MEMLOCK succeeds (see scripts/youki.sh); nothing else changes. */
static int memlock_ok(int ret, int resource) {
  if (ret != 0 && errno == EPERM && resource == RLIMIT_MEMLOCK) {
    errno = 0;
    return 0;
  }
  return ret;
}
int setrlimit(__rlimit_resource_t resource, const struct rlimit *limit) {
  int (*real)(__rlimit_resource_t, const struct rlimit *) = dlsym(RTLD_NEXT, "setrlimit");
  return memlock_ok(real(resource, limit), resource);
}
int setrlimit64(__rlimit_resource_t resource, const struct rlimit64 *limit) {
  int (*real)(__rlimit_resource_t, const struct rlimit64 *) = dlsym(RTLD_NEXT, "setrlimit64");
  return memlock_ok(real(resource, limit), resource);
}
C
    fail "cc could not build $MEMLOCK (see $LOG): $(grep -m1 -i error "$LOG" || tail -1 "$LOG")"
  mv "$MEMLOCK.new" "$MEMLOCK"
  rm -f "$LOG"
  # Engines (Podman's --runtime, containerd's BinaryName, nvhook's runtimes) run a runtime with
  # an environment of their own: the wrapper sets LD_PRELOAD itself, found beside it.
  cat >"$WRAPPER.new" <<'SH'
#!/bin/sh
# youki with ../lib/memlock.so preloaded: see scripts/youki.sh.
here=$(dirname "$(readlink -f "$0")")
LD_PRELOAD="$here/../lib/memlock.so${LD_PRELOAD:+:$LD_PRELOAD}" exec "$here/youki" "$@"
SH
  chmod 755 "$WRAPPER.new"
  mv "$WRAPPER.new" "$WRAPPER"
  echo "youki: $WRAPPER (youki with $MEMLOCK preloaded, for cgroup v2)"
fi
