#!/usr/bin/env bash
# Builds nvhook, nvhook-runtime and nvhook-nvml for aarch64-unknown-linux-gnu (issue 29), in
# the Debian sid root that scripts/arm64-toolchain.sh makes (run it first; it is fast once
# done). The binaries land in .cross/aarch64/ (or $NVHOOK_ARM64_OUT).
#
# The build runs in a private mount namespace: the project is bound at /src in the root, the
# host's cargo registry at /root/.cargo/registry (the build is offline: `cargo fetch` on the
# host first if Cargo.lock changed), and every mount goes when the build ends.
#
#   NVHOOK_CROSS_ROOT    the toolchain root (default: .cross/sid-root)
#   NVHOOK_ARM64_OUT     where the three binaries are copied (default: .cross/aarch64)
#   NVHOOK_ARM64_PROFILE release (default) or dev
#   CARGO_HOME           the host's cargo home, for its registry (default: ~/.cargo)
set -euo pipefail
cd "$(dirname "$0")/.."
PROJECT=$PWD
ROOT=${NVHOOK_CROSS_ROOT:-$PROJECT/.cross/sid-root}
OUT=${NVHOOK_ARM64_OUT:-$PROJECT/.cross/aarch64}
PROFILE=${NVHOOK_ARM64_PROFILE:-release}
REGISTRY=${CARGO_HOME:-$HOME/.cargo}/registry
TARGET=aarch64-unknown-linux-gnu
BINARIES=(nvhook nvhook-runtime nvhook-nvml)

[ "$(id -u)" = 0 ] || { echo "build-arm64.sh: run as root (the build runs in a chroot)" >&2; exit 1; }
[ -f "$ROOT/.nvhook-toolchain" ] || {
  echo "build-arm64.sh: no toolchain in $ROOT: run scripts/arm64-toolchain.sh first" >&2
  exit 1
}
[ -d "$REGISTRY" ] || {
  echo "build-arm64.sh: no cargo registry at $REGISTRY: run cargo fetch on the host first" >&2
  exit 1
}
case $PROFILE in
  release) dir=release ;;
  dev) dir=debug ;;
  *) echo "build-arm64.sh: NVHOOK_ARM64_PROFILE is release or dev, not $PROFILE" >&2; exit 1 ;;
esac

# Inside the chroot; the target directory is ignored by git (.cross/).
build() {
  cd /src
  export CARGO_HOME=/root/.cargo CARGO_TARGET_DIR=/src/.cross/target
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  cargo build --offline --locked --profile "$PROFILE" --target "$TARGET" \
    -p nvhook --bin nvhook -p nvhook-runtime --bin nvhook-runtime -p nvhook-nvml --bin nvhook-nvml
}

mkdir -p "$ROOT/src" "$ROOT/root/.cargo/registry" "$ROOT/proc" "$ROOT/dev"
unshare -m --propagation private bash -euo pipefail -c '
  mount --bind "$1" "$2/src"
  mount --bind "$3" "$2/root/.cargo/registry"
  mount -t proc proc "$2/proc"
  mount --rbind /dev "$2/dev"
  chroot "$2" env -i PATH=/usr/bin:/bin HOME=/root PROFILE="$4" TARGET="$5" bash -euo pipefail -c "$6"
' unshare "$PROJECT" "$ROOT" "$REGISTRY" "$PROFILE" "$TARGET" "$(declare -f build); build"

mkdir -p "$OUT"
for bin in "${BINARIES[@]}"; do
  cp "$PROJECT/.cross/target/$TARGET/$dir/$bin" "$OUT/$bin"
done
echo "build-arm64.sh: ${BINARIES[*]} for $TARGET in $OUT"
