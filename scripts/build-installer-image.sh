#!/usr/bin/env bash
# Builds the Kubernetes installer image (deploy/kubernetes/Containerfile) in one command:
#
#   scripts/build-installer-image.sh [IMAGE]
#
# IMAGE defaults to the name nvhook-installer.yaml uses, ghcr.io/nvhook/nvhook-installer:<version>;
# push it (docker push IMAGE) or set the manifests' image to your own registry's name.
# Uses docker, or podman where there is no docker. Environment:
#   BIN_DIR   take nvhook, nvhook-runtime and nvhook-nvml from here instead of building them
#             (cargo build --release into target/release)
#   BASE      the base image (default debian:bookworm-slim)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
version=$(cd "$repo" && cargo pkgid --quiet -p nvhook | sed 's/.*[#@]//')
image=${1:-ghcr.io/nvhook/nvhook-installer:$version}
engine=$(command -v docker || command -v podman || true)
[ -n "$engine" ] || { echo "build-installer-image: needs docker or podman" >&2; exit 1; }

if [ -z "${BIN_DIR:-}" ]; then
    (cd "$repo" && cargo build --release --locked --quiet -p nvhook -p nvhook-runtime -p nvhook-nvml)
    BIN_DIR=$repo/target/release
fi
# The context holds only what the image gets: not the repository's target directory.
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
for name in nvhook nvhook-runtime nvhook-nvml; do
    [ -x "$BIN_DIR/$name" ] || { echo "build-installer-image: $BIN_DIR/$name is missing" >&2; exit 1; }
    cp "$BIN_DIR/$name" "$context/"
done
cp "$repo/deploy/kubernetes/install.sh" "$repo/deploy/kubernetes/refresh.sh" "$context/"
"$engine" build --quiet --file "$repo/deploy/kubernetes/Containerfile" \
    ${BASE:+--build-arg "BASE=$BASE"} --tag "$image" "$context" >/dev/null
echo "$image"
