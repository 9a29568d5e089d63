#!/usr/bin/env bash
# A cross toolchain for aarch64-unknown-linux-gnu (issue 29): a Debian sid root under
# .cross/sid-root with Debian's rustc and cargo, the arm64 std (libstd-rust-dev:arm64), the
# aarch64 cross gcc and the arm64 glibc (libc6-dev:arm64, static archives included).
# rustup's aarch64 std is not needed: Debian's rustc carries the target itself.
# protobuf-compiler: protoc, for k8s-cri (the CRI client the tests use), whose build script runs it:
# the workspace's unit tests build it as a dev-dependency.
# libc-bin:arm64, unpacked under /opt/arm64-libc-bin (it cannot be installed beside the root's
# own libc-bin): its static aarch64 ldconfig, run under qemu-aarch64, writes the arm64 simulated
# node's loader cache (tests/arm64_e2e.rs), as the real ldconfig of an arm64 host would.
# qemu-aarch64 from sid's qemu-user (static), unpacked under /opt/qemu: scripts/arm64-binfmt.sh
# registers it for the emulated node (Debian 12's qemu-user-static 7.2 lacks the new mount API).
# busybox-static:arm64's busybox under /opt/arm64-busybox: the shell of the arm64 installer image
# that tests/kubernetes_deploy.rs builds (no registry is reachable for a Debian arm64 base).
#
# Idempotent: a root that is complete (its stamp file names the package set) is left alone, so
# a second run takes well under a second. Run as root (debootstrap and chroot need it).
# scripts/build-arm64.sh builds the workspace in it.
#
#   NVHOOK_CROSS_ROOT   where the root lives (default: .cross/sid-root, ignored by git)
#   NVHOOK_CROSS_MIRROR Debian mirror (default: the one the system's apt sources use)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${NVHOOK_CROSS_ROOT:-$PWD/.cross/sid-root}
fail() {
  echo "arm64-toolchain.sh: $*" >&2
  exit 1
}
. scripts/sid-apt.sh
MIRROR=${NVHOOK_CROSS_MIRROR:-$(debian_mirror)}
PACKAGES="rustc cargo libstd-rust-dev:arm64 gcc-aarch64-linux-gnu libc6-dev:arm64 protobuf-compiler"
STAMP=$ROOT/.nvhook-toolchain
ARM64_LDCONFIG=/opt/arm64-libc-bin/usr/sbin/ldconfig
QEMU=/opt/qemu/qemu-aarch64
BUSYBOX=/opt/arm64-busybox/usr/bin/busybox

[ "$(id -u)" = 0 ] || { echo "arm64-toolchain.sh: run as root (debootstrap and chroot need it)" >&2; exit 1; }

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PACKAGES $ARM64_LDCONFIG $QEMU $BUSYBOX" ]; then
  echo "arm64-toolchain.sh: $ROOT is ready ($(chroot "$ROOT" rustc --version))"
  exit 0
fi

command -v debootstrap >/dev/null || {
  echo "arm64-toolchain.sh: missing debootstrap: apt-get install -y debootstrap" >&2
  exit 1
}

mkdir -p "$(dirname "$ROOT")"
if [ ! -x "$ROOT/usr/bin/apt-get" ] || [ ! -f "$ROOT/.nvhook-debootstrap" ]; then
  rm -rf "$ROOT"
  debootstrap --variant=minbase sid "$ROOT" "$MIRROR" >/dev/null
  touch "$ROOT/.nvhook-debootstrap"
fi

# The host's resolver, for apt in the root.
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
chroot "$ROOT" dpkg --add-architecture arm64
export DEBIAN_FRONTEND=noninteractive
APT="-o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false -o APT::Sandbox::User=root -qq"
chroot "$ROOT" apt-get $APT update
chroot "$ROOT" apt-get $APT install -y $PACKAGES >/dev/null
chroot "$ROOT" sh -euc "
  rm -rf /opt/arm64-libc-bin /tmp/arm64-libc-bin && mkdir -p /tmp/arm64-libc-bin && cd /tmp/arm64-libc-bin
  apt-get $APT download libc-bin:arm64
  dpkg -x libc-bin_*_arm64.deb /opt/arm64-libc-bin
  apt-get $APT download qemu-user
  rm -rf /opt/qemu && mkdir -p /opt/qemu
  dpkg-deb --fsys-tarfile qemu-user_*.deb | tar -xf - -O ./usr/bin/qemu-aarch64 >$QEMU
  chmod 755 $QEMU
  apt-get $APT download busybox-static:arm64
  rm -rf /opt/arm64-busybox && dpkg -x busybox-static_*_arm64.deb /opt/arm64-busybox
  test -x $BUSYBOX
  cd / && rm -rf /tmp/arm64-libc-bin
  test -x $ARM64_LDCONFIG
  $QEMU --version >/dev/null
"
chroot "$ROOT" apt-get $APT clean
echo "$PACKAGES $ARM64_LDCONFIG $QEMU $BUSYBOX" >"$STAMP"
echo "arm64-toolchain.sh: $ROOT is ready ($(chroot "$ROOT" rustc --version))"
