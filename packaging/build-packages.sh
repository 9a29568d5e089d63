#!/usr/bin/env bash
# Builds the packages users install, for one architecture (the first argument):
#   amd64 (default)  <target>/packages/nvhook_<version>_amd64.deb, nvhook-<version>-1.x86_64.rpm
#                    from release binaries built here
#   arm64            <target>/packages/nvhook_<version>_arm64.deb, nvhook-<version>-1.aarch64.rpm
#                    from the aarch64 binaries scripts/build-arm64.sh left in .cross/aarch64
#                    (or $NVHOOK_ARM64_OUT): run scripts/arm64-toolchain.sh and
#                    scripts/build-arm64.sh first (its default profile, release, for packages
#                    you ship). Their usage.txt is rendered by the aarch64 nvhook itself, a
#                    static program that qemu-user-static runs through binfmt_misc.
# Both can lie side by side in <target>/packages/: each run replaces only its own architecture's.
# <target> is $CARGO_TARGET_DIR, else ./target (the cargo default), the same directory the
# package tests derive from their own location. Package metadata: Cargo.toml's
# [package.metadata.deb] and [package.metadata.generate-rpm]; maintainer scripts: packaging/scripts/.
# Needs dpkg-dev (dpkg-shlibdeps computes the libc dependency); the two cargo tools are
# installed with `cargo install --locked` at the versions pinned here when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0
CARGO_GENERATE_RPM_VERSION=0.21.1

ARCH=${1:-amd64}
case $ARCH in
    amd64) triple=x86_64-unknown-linux-gnu rpm_arch=x86_64 ;;
    arm64) triple=aarch64-unknown-linux-gnu rpm_arch=aarch64 ;;
    *) echo "build-packages: the architecture is amd64 or arm64, not $ARCH" >&2; exit 1 ;;
esac

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
out=$target/packages
version=$(cargo pkgid --quiet -p nvhook | sed 's/.*[#@]//')
binaries=(nvhook nvhook-runtime nvhook-nvml)

if [ "$ARCH" = amd64 ]; then
    # The host's own build: the tools read target/release/.
    release=$target/release
    target_args=()
    variant_args=()
    # cargo-generate-rpm ships the binaries as they are: have the linker strip them.
    CARGO_PROFILE_RELEASE_STRIP=symbols cargo build --release --locked --bins -p nvhook -p nvhook-runtime -p nvhook-nvml
else
    # Cross: both tools read target/<triple>/release/ when given --target; the aarch64 binaries
    # (stripped by build-arm64.sh's release build) are copied there.
    release=$target/$triple/release
    target_args=(--target "$triple")
    # Cargo.toml's [package.metadata.deb.variants.arm64]: its libc dependency, named. The host's
    # strip cannot read aarch64 files: build-arm64.sh's release build is stripped already.
    variant_args=(--variant arm64 --no-strip)
    from=${NVHOOK_ARM64_OUT:-$PWD/.cross/aarch64}
    mkdir -p "$release"
    for bin in "${binaries[@]}"; do
        [ -f "$from/$bin" ] || {
            echo "build-packages: no aarch64 $bin in $from: run scripts/arm64-toolchain.sh and scripts/build-arm64.sh first" >&2
            exit 1
        }
        # e_machine, bytes 18-19 of the ELF header: 183 (EM_AARCH64) is b7 00.
        [ "$(od -An -tx1 -j18 -N2 "$from/$bin" | tr -d ' \n')" = b700 ] || {
            echo "build-packages: $from/$bin is not an aarch64 ELF file: rebuild it with scripts/build-arm64.sh" >&2
            exit 1
        }
        cp "$from/$bin" "$release/$bin"
    done
    "$release/nvhook" --version >/dev/null 2>&1 || {
        echo "build-packages: cannot run the aarch64 nvhook to render usage.txt: install qemu-user-static and binfmt-support (apt-get install -y qemu-user-static binfmt-support)" >&2
        exit 1
    }
fi

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
        printf '\n---- nvhook help %s\n\n' "$subcommand"
        # `help SUBCOMMAND`, not `SUBCOMMAND --help`: `nvhook dra --help` is nvhook-dra's own,
        # which the packages do not carry.
        "$nvhook" help "$subcommand"
    done
}
render_usage >"$release/usage.txt"

deb=nvhook_${version}_$ARCH.deb
rpm=nvhook-${version}-1.$rpm_arch.rpm
mkdir -p "$out"
rm -f "$out/$deb" "$out/$rpm"
cargo deb --no-build --quiet "${target_args[@]}" "${variant_args[@]}" --output "$out/$deb" >/dev/null
cargo generate-rpm "${target_args[@]}" --output "$out/$rpm"

for package in "$deb" "$rpm"; do
    [ -f "$out/$package" ] || {
        echo "build-packages: $out/$package was not written (found: $(ls "$out"))" >&2
        exit 1
    }
    echo "$out/$package"
done
