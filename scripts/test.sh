#!/usr/bin/env bash
# The whole test suite: unit, integration and end-to-end (real runc containers).
# Needs root; the end-to-end tests fail (not skip) when runc, gcc or busybox-static is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require.sh
require_root test "device nodes, cgroups, runc"
require_rust test
require_programs test runc crun cc ld python3 /bin/busybox containerd ctr dockerd podman newuidmap \
  ip unshare protoc rpm dpkg-architecture musl-gcc systemd-run
# containerd 2 (Debian sid's) for tests/containerd2_e2e.rs, fetched into .engines/sid once.
scripts/sid-engines.sh
# Test binaries locate simnode and the mock NVML in target/debug: build every member first.
cargo build --workspace
# tests/packages.rs reads the .deb and .rpm from target/packages/ (cargo test cannot run a nested
# cargo build: it holds the target directory lock).
packaging/build-packages.sh
cargo test --workspace
