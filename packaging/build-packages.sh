#!/usr/bin/env bash
# Builds the release binaries and the packages users install:
#   <target>/packages/nvhook_<version>_amd64.deb      (cargo-deb)
#   <target>/packages/nvhook-<version>-1.x86_64.rpm   (cargo-generate-rpm)
# <target> is $CARGO_TARGET_DIR, else ./target (the cargo default), the same directory the
# package tests derive from their own location. Package metadata: Cargo.toml's
# [package.metadata.deb] and [package.metadata.generate-rpm]; maintainer scripts: packaging/scripts/.
# Needs dpkg-dev (dpkg-shlibdeps computes the libc dependency); the two cargo tools are
# installed with `cargo install --locked` at the versions pinned here when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0
CARGO_GENERATE_RPM_VERSION=0.21.1

# require_tool SUBCOMMAND CRATE VERSION
require_tool() {
    local subcommand=$1 crate=$2 version=$3
    if cargo "$subcommand" --version 2>/dev/null | grep -qwF -- "$version"; then
        return
    fi
    echo "build-packages: installing $crate $version" >&2
    # cargo install builds in a temporary directory of its own unless CARGO_TARGET_DIR names one;
    # keep the tools' build out of the project's target directory.
    env -u CARGO_TARGET_DIR cargo install --locked --quiet "$crate@$version"
}

require_tool deb cargo-deb "$CARGO_DEB_VERSION"
require_tool generate-rpm cargo-generate-rpm "$CARGO_GENERATE_RPM_VERSION"

target=${CARGO_TARGET_DIR:-$PWD/target}
release=$target/release
out=$target/packages
version=$(cargo pkgid --quiet -p nvhook | sed 's/.*[#@]//')

# cargo-generate-rpm ships the binaries as they are: have the linker strip them.
CARGO_PROFILE_RELEASE_STRIP=symbols cargo build --release --locked --bins -p nvhook -p nvhook-runtime -p nvhook-nvml

# The command-line reference, rendered from the binaries just built so it cannot drift from them:
# `nvhook --help`, then the help of each subcommand that help lists.
render_usage() {
    local nvhook=$release/nvhook subcommand
    echo "nvhook $version: command-line reference (the binaries' own --help)."
    echo "nvhook-runtime takes runc's arguments and execs runc or crun; see README.md."
    echo "nvhook-nvml is run by nvhook, with no environment, to ask NVML about the GPUs."
    echo
    "$nvhook" --help
    for subcommand in $("$nvhook" --help | awk '/^Commands:/ { listing = 1; next } listing && NF == 0 { exit } listing && $1 != "help" { print $1 }'); do
        printf '\n---- nvhook %s --help\n\n' "$subcommand"
        "$nvhook" "$subcommand" --help
    done
}
render_usage >"$release/usage.txt"

rm -rf "$out"
mkdir -p "$out"
cargo deb --no-build --quiet --output "$out/" >/dev/null
cargo generate-rpm --output "$out/"

for package in "nvhook_${version}_amd64.deb" "nvhook-${version}-1.x86_64.rpm"; do
    [ -f "$out/$package" ] || {
        echo "build-packages: $out/$package was not written (found: $(ls "$out"))" >&2
        exit 1
    }
    echo "$out/$package"
done
