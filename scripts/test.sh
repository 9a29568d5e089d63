#!/usr/bin/env bash
# The whole test suite: unit, integration and end-to-end (real runc containers).
# Needs root; the end-to-end tests fail (not skip) when runc, gcc or busybox-static is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "test: run as root (device nodes, cgroups, runc)" >&2; exit 1; }
# Test binaries locate simnode and the mock NVML in target/debug: build every member first.
cargo build --workspace
# tests/packages.rs reads the .deb and .rpm from target/packages/ (cargo test cannot run a nested
# cargo build: it holds the target directory lock).
packaging/build-packages.sh
cargo test --workspace
