#!/usr/bin/env bash
# The whole test suite: unit, integration and end-to-end (real runc containers).
# Needs root; the end-to-end tests fail (not skip) when runc, gcc or busybox-static is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require.sh
require_root test "device nodes, cgroups, runc"
require_rust test
require_programs test runc crun cc ld python3 /bin/busybox containerd ctr dockerd podman newuidmap \
  ip unshare protoc rpm dpkg-architecture musl-gcc systemd-run debootstrap qemu-aarch64-static \
  update-binfmts make pkg-config /usr/lib/cni/bridge

# step WHAT COMMAND...: runs a step whose failure (after its own output) ends the run with one
# line naming the step.
step() {
  local what=$1 rc
  shift
  "$@" || {
    rc=$?
    echo "test.sh: $what failed (exit $rc): $*" >&2
    exit 1
  }
}
# containerd 2 (Debian sid's) for tests/containerd2_e2e.rs, fetched into .engines/sid once.
scripts/sid-engines.sh
# youki, and sid's runc 1.3 and crun, for tests/runtimes_e2e.rs: youki built from crates.io into
# .engines/youki once, sid's runtimes installed in a sid root (.engines/sid-root) once.
step "youki (scripts/youki.sh)" scripts/youki.sh
step "sid's runc and crun (scripts/sid-runtimes.sh)" scripts/sid-runtimes.sh
# Test binaries locate simnode and the mock NVML in target/debug: build every member first.
cargo build --workspace
# tests/packages.rs reads the .deb and .rpm from target/packages/ (cargo test cannot run a nested
# cargo build: it holds the target directory lock).
packaging/build-packages.sh
# arm64 (issue 29), every run: the cross toolchain (a Debian sid root in .cross/, kept between
# runs), the aarch64 build with the workspace's unit tests run under qemu-user (the arm64-check
# profile: no fat LTO), the emulated arm64 node's kit (tests/arm64_e2e.rs: sid's qemu-aarch64
# registered in binfmt_misc, the aarch64 mock NVML, gpucheck and glibc), and the arm64 .deb and
# .rpm that tests/packages.rs reads. The cross build is offline: fetch aarch64's crates first.
step "cargo fetch (the crates the offline arm64 build needs)" \
  cargo fetch --locked --target aarch64-unknown-linux-gnu
step "the arm64 toolchain (scripts/arm64-toolchain.sh)" scripts/arm64-toolchain.sh
step "sid's qemu-aarch64 in binfmt_misc, for the emulated arm64 node (scripts/arm64-binfmt.sh)" \
  scripts/arm64-binfmt.sh
step "the arm64 build and unit tests (scripts/build-arm64.sh)" \
  env NVHOOK_ARM64_PROFILE=arm64-check NVHOOK_ARM64_TESTS=1 scripts/build-arm64.sh
step "the arm64 packages (packaging/build-packages.sh arm64)" packaging/build-packages.sh arm64
cargo test --workspace
