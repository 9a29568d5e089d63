#!/usr/bin/env bash
# Regenerates tests/fixtures/nvidia-ctk/: CDI specs written by NVIDIA's own
# `nvidia-ctk cdi generate` on a simulated node (target/debug/simnode, mock libnvidia-ml).
#
# Usage: scripts/nvidia-ctk-fixtures.sh SRC
#   SRC: a source tree of NVIDIA/nvidia-container-toolkit (the fixtures were made from tag
#   v1.20.0, commit 5505e2f94d9aaa08561490db974ba3cd676af209), e.g. a checkout, or
#   `git archive v1.20.0 | tar -x -C SRC`. It is built offline from its vendor/ directory.
#   For an exported tree (no .git), NVCTK_COMMIT=<commit> names the commit in `--version`.
#
# Go comes from Debian sid, the way scripts/sid-engines.sh fetches engines: apt runs with a
# private sources list, lists, cache and (empty) dpkg status, downloads golang-X.Y-go and
# golang-X.Y-src, and `dpkg -x` unpacks them into .engines/go-sid/ (ignored by git); the
# system's packages are left alone. Which Go: NVHOOK_SID_GO (default golang-1.26: the toolkit's
# go.mod needs go 1.25.0, its devel image uses Go 1.26.5, and sid no longer has golang-1.25).
#
# nvidia-ctk runs with an empty environment (PATH only) and an empty config file, so that
# neither NVIDIA_CTK_* variables nor a host /etc/nvidia-container-runtime/config.toml change
# the specs. The node's root path becomes @NODE@ and the hook path @HOOK@ (sed).
# Needs root (simnode makes device nodes), cargo, gcc (cgo), apt-get and dpkg.
# Any failure stops it with one line that names the cause.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/sid-apt.sh

fail() {
  echo "nvidia-ctk-fixtures: $*" >&2
  exit 1
}

[ $# -eq 1 ] || fail "usage: $0 SRC (a nvidia-container-toolkit source tree, e.g. tag v1.20.0)"
SRC=$(cd "$1" 2>/dev/null && pwd) || fail "$1 is not a directory"
[ -f "$SRC/cmd/nvidia-ctk/main.go" ] && [ -d "$SRC/vendor" ] && [ -f "$SRC/versions.mk" ] ||
  fail "$SRC is not a nvidia-container-toolkit source tree with vendor/ (cmd/nvidia-ctk/main.go, versions.mk)"
[ "$(id -u)" -eq 0 ] || fail "run as root: simnode makes device nodes"

ENGINES=$PWD/.engines
GO_DEST=$ENGINES/go-sid
GO_PACKAGE=${NVHOOK_SID_GO:-golang-1.26}
OUT=$PWD/tests/fixtures/nvidia-ctk
WORK=$ENGINES/nvctk
HOOK=/usr/bin/nvidia-cdi-hook
started=$(date +%s)

for program in apt-get apt-cache dpkg cargo gcc; do
  command -v $program >/dev/null || fail "$program is missing"
done
mkdir -p "$ENGINES" "$WORK"

# --- Go from Debian sid --------------------------------------------------------------------
go_bin=$GO_DEST/usr/lib/go-${GO_PACKAGE#golang-}/bin/go
if ! { [ -x "$go_bin" ] && [ -s "$GO_DEST/version" ]; }; then
  APT=$ENGINES/go-sid-apt
  rm -rf "$GO_DEST.new"
  mkdir -p "$GO_DEST.new"
  sid_apt "$APT"
  version=$(apt-cache "${sid_apt_options[@]}" policy "$GO_PACKAGE-go" | awk '/Candidate:/ { print $2 }')
  [ -n "$version" ] && [ "$version" != "(none)" ] ||
    fail "Debian sid has no $GO_PACKAGE-go package (any more): set NVHOOK_SID_GO to one it has (apt-cache search golang-1)"
  wanted=("$GO_PACKAGE-go=$version" "$GO_PACKAGE-src=$version")
  (cd "$APT/archives" && apt-get "${sid_apt_options[@]}" -qq download "${wanted[@]}") >"$APT/download.log" 2>&1 ||
    fail "apt-get download ${wanted[*]} from $SID_MIRROR sid failed: $(grep -m1 -E '^(E|W):' "$APT/download.log" || tail -1 "$APT/download.log")"
  for deb in "$APT"/archives/*.deb; do
    dpkg -x "$deb" "$GO_DEST.new" || fail "dpkg -x $deb failed"
  done
  [ -x "$GO_DEST.new/usr/lib/go-${GO_PACKAGE#golang-}/bin/go" ] ||
    fail "Debian sid's ${wanted[*]} have no usr/lib/go-${GO_PACKAGE#golang-}/bin/go"
  echo "$GO_PACKAGE $version" >"$GO_DEST.new/version"
  rm -rf "$GO_DEST"
  mv "$GO_DEST.new" "$GO_DEST"
  rm -rf "$APT"
fi
export GOROOT=${go_bin%/bin/go}
export GOTOOLCHAIN=local GOFLAGS=-mod=vendor GOPROXY=off CGO_ENABLED=1
export GOPATH=$WORK/gopath GOCACHE=$WORK/gocache
go_said=$("$go_bin" version 2>&1) || fail "sid's Go ($(cat "$GO_DEST/version")) does not run here: $go_said"

# --- nvidia-ctk ----------------------------------------------------------------------------
lib_version=$(awk '/^LIB_VERSION :=/ { print $3 }' "$SRC/versions.mk")
[ -n "$lib_version" ] || fail "$SRC/versions.mk has no LIB_VERSION"
commit=${NVCTK_COMMIT:-$(git -C "$SRC" rev-parse HEAD 2>/dev/null || true)}
CTK=$WORK/bin/nvidia-ctk
info=github.com/NVIDIA/nvidia-container-toolkit/internal/info
(cd "$SRC" && "$go_bin" build -ldflags "-X $info.version=$lib_version -X $info.gitCommit=$commit" \
  -o "$CTK" ./cmd/nvidia-ctk) >"$WORK/build.log" 2>&1 ||
  fail "go build ./cmd/nvidia-ctk in $SRC failed with $go_said (see $WORK/build.log): $(grep -m1 -E 'requires go|error|cannot' "$WORK/build.log" || tail -1 "$WORK/build.log")"
ctk_said=$("$CTK" --version 2>&1 | head -1) || fail "the nvidia-ctk built from $SRC does not run: $ctk_said"

# --- the simulated node ----------------------------------------------------------------------
cargo build -q -p simnode -p mock-nvml >"$WORK/cargo.log" 2>&1 ||
  fail "cargo build -p simnode -p mock-nvml failed (see $WORK/cargo.log): $(grep -m1 '^error' "$WORK/cargo.log" || tail -1 "$WORK/cargo.log")"
SIMNODE=$PWD/target/debug/simnode
NODE=$(mktemp -d /tmp/nvctk-node.XXXXXX)
trap '"$SIMNODE" destroy "$NODE" >/dev/null 2>&1 || true' EXIT
"$SIMNODE" create "$NODE" --gpus 4 --hook-path /usr/bin/nvhook >"$WORK/simnode.log" 2>&1 ||
  fail "simnode create $NODE --gpus 4 failed: $(tail -1 "$WORK/simnode.log")"

# --- the specs ---------------------------------------------------------------------------------
: >"$WORK/empty-config.toml"
mkdir -p "$OUT"
# generate NAME [FLAGS...]: tests/fixtures/nvidia-ctk/NAME.yaml
generate() {
  local name=$1
  shift
  env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$CTK" --config="$WORK/empty-config.toml" cdi generate \
    "$@" --driver-root="$NODE/driver" --dev-root="$NODE" --nvidia-cdi-hook-path="$HOOK" \
    --format=yaml --output="$WORK/$name.yaml" >"$WORK/$name.log" 2>&1 ||
    fail "nvidia-ctk cdi generate $* failed (see $WORK/$name.log): $(grep -m1 -E 'level=error|symbol lookup|rror' "$WORK/$name.log" || tail -1 "$WORK/$name.log")"
  sed -e "s#$NODE#@NODE@#g" -e "s#$HOOK#@HOOK@#g" "$WORK/$name.yaml" >"$OUT/$name.yaml"
  ! grep -q "$NODE" "$OUT/$name.yaml" || fail "$OUT/$name.yaml still names $NODE"
}
generate nvml-index --mode=nvml --device-name-strategy=index
generate nvml-uuid --mode=nvml --device-name-strategy=uuid
# nvidia-ctk's defaults (mode auto, which picks nvml; names by index and by uuid).
generate default
echo "nvidia-ctk-fixtures: $ctk_said (${commit:-commit unknown}), built with $go_said (Debian sid $(cat "$GO_DEST/version")): wrote $OUT/{nvml-index,nvml-uuid,default}.yaml in $(($(date +%s) - started))s"
