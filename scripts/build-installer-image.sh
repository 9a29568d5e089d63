#!/usr/bin/env bash
# Builds the Kubernetes installer image (deploy/kubernetes/Containerfile) in one command:
#
#   scripts/build-installer-image.sh [IMAGE]
#
# IMAGE defaults to the name nvhook-installer.yaml uses, ghcr.io/nvhook/nvhook-installer:<version>;
# push it (docker push IMAGE) or set the manifests' image to your own registry's name.
# Uses docker, or podman where there is no docker. Environment:
#   ARCH      amd64 (default) or arm64: the image's platform (linux/ARCH) and its binaries'
#             architecture. arm64's IMAGE defaults to ...:<version>-arm64 and its binaries to
#             scripts/build-arm64.sh's (.cross/aarch64). A fleet of both: build each, push each,
#             then one name for both with `docker manifest create NAME AMD64-IMAGE ARM64-IMAGE`
#             and `docker manifest push NAME` (a manifest list lives in a registry).
#   BIN_DIR   take nvhook, nvhook-runtime, nvhook-nvml and nvhook-dra from here instead of
#             building them (cargo build --release into target/release)
#   BASE      the base image (default debian:bookworm-slim, of ARCH)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
version=$(cd "$repo" && cargo pkgid --quiet -p nvhook | sed 's/.*[#@]//')
arch=${ARCH:-amd64}
case $arch in
    amd64) image=${1:-ghcr.io/nvhook/nvhook-installer:$version} machine=3e00 ;;
    # e_machine, ELF header bytes 18-19: EM_X86_64 (62) is 3e 00, EM_AARCH64 (183) b7 00.
    arm64) image=${1:-ghcr.io/nvhook/nvhook-installer:$version-arm64} machine=b700 ;;
    *) echo "build-installer-image: ARCH is amd64 or arm64, not $arch" >&2; exit 1 ;;
esac
engine=$(command -v docker || command -v podman || true)
[ -n "$engine" ] || { echo "build-installer-image: needs docker or podman" >&2; exit 1; }

if [ -z "${BIN_DIR:-}" ] && [ "$arch" = arm64 ]; then
    BIN_DIR=${NVHOOK_ARM64_OUT:-$repo/.cross/aarch64}
elif [ -z "${BIN_DIR:-}" ]; then
    (cd "$repo" && cargo build --release --locked --quiet -p nvhook -p nvhook-runtime -p nvhook-nvml \
        -p nvhook-dra-driver)
    BIN_DIR=$repo/target/release
fi
# The context holds only what the image gets: not the repository's target directory.
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
mkdir "$context/bin"
for name in nvhook nvhook-runtime nvhook-nvml nvhook-dra; do
    [ -x "$BIN_DIR/$name" ] || {
        hint=""
        [ "$arch" = arm64 ] && hint=" (run scripts/arm64-toolchain.sh and scripts/build-arm64.sh first)"
        echo "build-installer-image: $BIN_DIR/$name is missing$hint" >&2
        exit 1
    }
    [ "$(od -An -tx1 -j18 -N2 "$BIN_DIR/$name" | tr -d ' ')" = "$machine" ] || {
        echo "build-installer-image: $BIN_DIR/$name is not a $arch program" >&2
        exit 1
    }
    cp "$BIN_DIR/$name" "$context/bin/"
done
for script in install.sh refresh.sh uninstall.sh; do
    cp "$repo/deploy/kubernetes/$script" "$context/"
done
"$engine" build --quiet --platform "linux/$arch" --file "$repo/deploy/kubernetes/Containerfile" \
    ${BASE:+--build-arg "BASE=$BASE"} --tag "$image" "$context" >/dev/null
echo "$image"
