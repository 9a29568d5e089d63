# Sourced by demo.sh and test.sh: each check stops the script with one line that names what
# is missing and how to get it.

# The edition-2024 workspace needs this Rust (Cargo.toml's rust-version).
NVHOOK_RUST=1.88

require_root() {
  [ "$(id -u)" = 0 ] || { echo "$1: run as root ($2); with sudo, keep your PATH: sudo env \"PATH=\$PATH\" $0" >&2; exit 1; }
}

require_rust() {
  local have
  if ! command -v cargo >/dev/null || ! have=$(rustc --version 2>/dev/null); then
    echo "$1: cargo is missing: install Rust $NVHOOK_RUST or later (rustup.rs, or your distribution's rustc and cargo); under sudo, sudo's secure_path may hide it: sudo env \"PATH=\$PATH\" $0" >&2
    exit 1
  fi
  have=$(echo "$have" | awk '{ print $2 }')
  if [ "$(printf '%s\n%s\n' "$NVHOOK_RUST" "$have" | sort -V | head -1)" != "$NVHOOK_RUST" ]; then
    echo "$1: Rust $have is too old: nvhook needs $NVHOOK_RUST or later (rustup update)" >&2
    exit 1
  fi
}

# The Debian 12 package that brings each program the scripts need.
declare -A NVHOOK_PACKAGE=(
  [runc]=runc [crun]=crun [cc]=gcc [ld]=binutils [python3]=python3 [/bin/busybox]=busybox-static
  [containerd]=containerd [ctr]=containerd [dockerd]=docker.io [podman]=podman [newuidmap]=uidmap
  [ip]=iproute2 [unshare]=util-linux [protoc]=protobuf-compiler [rpm]=rpm [dpkg-architecture]=dpkg-dev
  [musl-gcc]=musl-tools [systemd-run]=systemd [debootstrap]=debootstrap
  [qemu-aarch64-static]=qemu-user-static [update-binfmts]=binfmt-support
  [make]=make [pkg-config]=pkg-config [/usr/lib/cni/bridge]=containernetworking-plugins
  [nm]=binutils [perf]=linux-perf [valgrind]=valgrind [strace]=strace
)

require_programs() {
  local who=$1 program missing=() packages=()
  shift
  for program; do
    command -v "$program" >/dev/null && continue
    missing+=("$program")
    packages+=("${NVHOOK_PACKAGE[$program]}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "$who: missing ${missing[*]}: apt-get install -y $(printf '%s\n' "${packages[@]}" | sort -u | tr '\n' ' ')" >&2
    exit 1
  fi
}
