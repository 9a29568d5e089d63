#!/usr/bin/env bash
# Builds nvhook, nvhook-runtime, nvhook-nvml and nvhook-dra for aarch64-unknown-linux-gnu, in
# the Debian sid root that scripts/arm64-toolchain.sh makes (run it first; it is fast once
# done). The binaries land in .cross/aarch64/ (or $NVHOOK_ARM64_OUT), with what the emulated
# arm64 node of tests/arm64_e2e.rs needs besides: the mock NVML (libmock_nvml.so) and the
# container probe (gpucheck), both aarch64, and glibc/: the arm64 glibc (Debian's libc6:arm64
# and libgcc-s1:arm64 from the root, their loader at /lib as on an arm64 host) that the
# emulated node's host side (qemu's QEMU_LD_PREFIX) and its arm64 image are made of.
#
# The build runs in a private mount namespace: the project is bound at /src in the root, the
# host's cargo registry at /root/.cargo/registry (the build is offline: `cargo fetch` on the
# host first if Cargo.lock changed), and every mount goes when the build ends.
#
#   NVHOOK_CROSS_ROOT    the toolchain root (default: .cross/sid-root)
#   NVHOOK_ARM64_OUT     where the binaries are copied (default: .cross/aarch64)
#   NVHOOK_ARM64_PROFILE release (default: what packages ship), dev, or arm64-check (Cargo.toml:
#                        release's panic = "abort" without fat LTO or debug info; what every test
#                        run builds, a fraction of release's time)
#   NVHOOK_ARM64_TESTS   1: then run the workspace's unit tests (the libraries' and nvhook-nvml's)
#                        for aarch64 in the root, under sid's qemu-aarch64 (from the toolchain
#                        root), which scripts/arm64-binfmt.sh registers in binfmt_misc first
#   CARGO_HOME           the host's cargo home, for its registry (default: ~/.cargo)
set -euo pipefail
cd "$(dirname "$0")/.."
PROJECT=$PWD
ROOT=${NVHOOK_CROSS_ROOT:-$PROJECT/.cross/sid-root}
OUT=${NVHOOK_ARM64_OUT:-$PROJECT/.cross/aarch64}
PROFILE=${NVHOOK_ARM64_PROFILE:-release}
REGISTRY=${CARGO_HOME:-$HOME/.cargo}/registry
TARGET=aarch64-unknown-linux-gnu
BINARIES=(nvhook nvhook-runtime nvhook-nvml nvhook-dra)

[ "$(id -u)" = 0 ] || { echo "build-arm64.sh: run as root (the build runs in a chroot)" >&2; exit 1; }
[ -f "$ROOT/.nvhook-toolchain" ] || {
  echo "build-arm64.sh: no toolchain in $ROOT: run scripts/arm64-toolchain.sh first" >&2
  exit 1
}
[ -d "$REGISTRY" ] || {
  echo "build-arm64.sh: no cargo registry at $REGISTRY: run cargo fetch on the host first" >&2
  exit 1
}
TESTS=${NVHOOK_ARM64_TESTS:-0}
case $PROFILE in
  release | arm64-check) dir=$PROFILE ;;
  dev) dir=debug ;;
  *) echo "build-arm64.sh: NVHOOK_ARM64_PROFILE is release, dev or arm64-check, not $PROFILE" >&2; exit 1 ;;
esac
if [ "$TESTS" = 1 ]; then
  # Debian 12's qemu (7.2) answers the mount API that nvhook's code and its unit tests use with
  # ENOSYS: the tests run under sid's, which arm64-binfmt.sh registers in front of any other.
  NVHOOK_CROSS_ROOT=$ROOT scripts/arm64-binfmt.sh
fi

# Inside the chroot; the target directory is ignored by git (.cross/).
build() {
  cd /src
  export CARGO_HOME=/root/.cargo CARGO_TARGET_DIR=/src/.cross/target
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  # As packaging/build-packages.sh builds amd64's: packages ship the binaries as they are.
  export CARGO_PROFILE_RELEASE_STRIP=symbols
  cargo build --offline --locked --profile "$PROFILE" --target "$TARGET" \
    -p nvhook --bin nvhook -p nvhook-runtime --bin nvhook-runtime -p nvhook-nvml --bin nvhook-nvml \
    -p nvhook-dra-driver --bin nvhook-dra
  # Apart: with --bin above, cargo would build only binaries of every package named.
  cargo build --offline --locked --profile "$PROFILE" --target "$TARGET" -p mock-nvml --lib
  aarch64-linux-gnu-gcc -O1 -Wall -Wextra -Werror -o "/src/.cross/target/$TARGET/gpucheck" \
    /src/tests/gpucheck.c
  if [ "$TESTS" = 1 ]; then
    # The kernel hands each aarch64 test binary to qemu-aarch64 (binfmt_misc); its loader and
    # libc are the root's libc6:arm64.
    # Every library's unit tests and nvhook-nvml's; not nvhook's and nvhook-runtime's bins
    # (`test = false`: no harness), nor simnode's (test tooling that builds C with the host's
    # cc), nor the integration tests (x86_64 end-to-end containers).
    cargo test --offline --locked --profile "$PROFILE" --target "$TARGET" --workspace --lib \
      --bin nvhook-nvml
  fi
}

mkdir -p "$ROOT/src" "$ROOT/root/.cargo/registry" "$ROOT/proc" "$ROOT/dev"
unshare -m --propagation private bash -euo pipefail -c '
  mount --bind "$1" "$2/src"
  mount --bind "$3" "$2/root/.cargo/registry"
  mount -t proc proc "$2/proc"
  mount --rbind /dev "$2/dev"
  chroot "$2" env -i PATH=/usr/bin:/bin HOME=/root PROFILE="$4" TARGET="$5" TESTS="$6" bash -euo pipefail -c "$7"
' unshare "$PROJECT" "$ROOT" "$REGISTRY" "$PROFILE" "$TARGET" "$TESTS" "$(declare -f build); build"

mkdir -p "$OUT"
for bin in "${BINARIES[@]}" libmock_nvml.so; do
  cp "$PROJECT/.cross/target/$TARGET/$dir/$bin" "$OUT/$bin"
done
cp "$PROJECT/.cross/target/$TARGET/gpucheck" "$OUT/gpucheck"
rm -rf "$OUT/glibc.new"
mkdir -p "$OUT/glibc.new"
chroot "$ROOT" dpkg -L libc6:arm64 libgcc-s1:arm64 | while read -r path; do
  if [ -L "$ROOT$path" ] || [ -f "$ROOT$path" ]; then
    printf '%s\n' "${path#/}"
  fi
done | (cd "$ROOT" && tar -cf - --no-recursion -T -) | tar -xf - -C "$OUT/glibc.new"
ln -s usr/lib "$OUT/glibc.new/lib"
[ -e "$OUT/glibc.new/lib/ld-linux-aarch64.so.1" ] || {
  echo "build-arm64.sh: libc6:arm64 in $ROOT has no /usr/lib/ld-linux-aarch64.so.1" >&2
  exit 1
}
rm -rf "$OUT/glibc"
mv "$OUT/glibc.new" "$OUT/glibc"
echo "build-arm64.sh: ${BINARIES[*]}, libmock_nvml.so, gpucheck and glibc/ for $TARGET in $OUT"
