#!/usr/bin/env bash
# Registers Debian sid's static qemu-aarch64 (unpacked by scripts/arm64-toolchain.sh) in
# binfmt_misc as `nvhook-qemu-aarch64`, for the emulated arm64 node of tests/arm64_e2e.rs.
#
# Why not Debian 12's qemu-user-static (7.2): it does not translate open_tree and move_mount
# (ENOSYS), with which nvhook mounts the driver's files; sid's qemu (11.x) does. The F flag makes
# the kernel open the interpreter now, so that it serves in chroots and containers too. The
# newest registration of a format is tried first: while this one is registered, every aarch64
# program on the machine runs under sid's qemu. It does not survive a reboot; to remove it:
#   echo -1 > /proc/sys/fs/binfmt_misc/nvhook-qemu-aarch64
# Idempotent: a registration of the same interpreter, enabled, is left alone.
#
#   NVHOOK_CROSS_ROOT   the toolchain root (default: .cross/sid-root)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${NVHOOK_CROSS_ROOT:-$PWD/.cross/sid-root}
QEMU=$ROOT/opt/qemu/qemu-aarch64
BINFMT=/proc/sys/fs/binfmt_misc
NAME=nvhook-qemu-aarch64
ENTRY=$BINFMT/$NAME
# An aarch64 ELF executable's header (machine 0xb7), and which of its bits count: qemu's own.
MAGIC='\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
MASK='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'

fail() {
  echo "arm64-binfmt.sh: $*" >&2
  exit 1
}
[ "$(id -u)" = 0 ] || fail "run as root (binfmt_misc registrations are the kernel's)"
[ -x "$QEMU" ] || fail "no $QEMU: run scripts/arm64-toolchain.sh first"
if [ ! -e "$BINFMT/register" ]; then
  mount -t binfmt_misc binfmt_misc "$BINFMT" || fail "cannot mount binfmt_misc at $BINFMT"
fi
# The kernel tries the newest registration first: a registration of Debian's own qemu-aarch64
# made after ours (qemu-user-static reinstalled, update-binfmts --enable) would win, and its
# qemu lacks the mount API nvhook uses ("Function not implemented"). Registering again makes
# ours the newest, every run.
if [ -e "$ENTRY" ]; then
  echo -1 >"$ENTRY"
fi
printf ':%s:M::%s:%s:%s:PF\n' "$NAME" "$MAGIC" "$MASK" "$QEMU" >"$BINFMT/register" ||
  fail "the kernel refused the registration of $QEMU"
# Which qemu the kernel now runs an aarch64 program with (any qemu-user prints its version and
# exits when QEMU_VERSION is set): ours, or the registration in front is named.
PROBE=$ROOT/usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1
[ -x "$PROBE" ] || fail "no $PROBE to try the registration with: run scripts/arm64-toolchain.sh first"
want=$("$QEMU" --version | head -1)
got=$(QEMU_VERSION=1 "$PROBE" 2>&1 | head -1) || true
if [ "$got" != "$want" ]; then
  front=
  for entry in "$BINFMT"/*; do
    [ "$entry" != "$ENTRY" ] && [ -f "$entry" ] && grep -qx enabled "$entry" &&
      grep -q '^magic 7f454c460201010000000000000000000200b700' "$entry" &&
      front="$front ${entry##*/} ($(sed -n 's/^interpreter //p' "$entry"))"
  done
  fail "aarch64 programs still run under \"$got\", not $NAME's qemu: registered in front of it:${front:- none found}; disable that entry (echo 0 > $BINFMT/NAME) and run this script again"
fi
echo "arm64-binfmt.sh: $NAME registered, and runs aarch64 programs ($want)"
