#!/usr/bin/env bash
# Debian sid's runc, crun and Podman 5 (issue 38), next to Debian 12's, for the runtime stack of
# 2026: .engines/sid-bin/runc, crun and podman (ignored by git) run them with the same
# arguments, stdio, pid and exit status as the programs themselves. Podman, conmon and the
# runtimes it runs share the namespace of its wrapper, so one `podman run` sees sid's runc.
#
# sid builds them against a glibc newer than Debian 12's, so they cannot run on the host's
# /usr, and copying them out would not help: runc re-executes itself (/proc/self/exe, for
# `runc init`), which a loader trick (ld.so --library-path) does not survive. They are
# installed instead, with their libraries, in a Debian sid root (debootstrap, as
# scripts/arm64-toolchain.sh makes .cross/sid-root), and each wrapper enters a private mount
# namespace in which that root's /usr is stacked over the host's (an overlay, the root's files
# first), then execs the runtime. Everything else is the host's: bundles, /run, /sys/fs/cgroup,
# /etc (so the host's ld.so.cache: it names the host's libraries, which nvhook's driver lookup
# reads, and sid's loader finds sid's own through the overlay at the same paths). The host's
# /usr stays visible under the root's, so that the hooks the runtime runs still find the host's
# programs (busybox, say) and libraries; a dynamic program of the host runs there with sid's
# glibc, which is newer, hence compatible.
# With NVHOOK_SID_USER=NAME set, the program runs as that user (and its group of the same
# name), once the namespace is made: rootless Podman.
# The namespace is a slave of the caller's: it receives the caller's mounts (a cgroup2 mounted
# over /sys/fs/cgroup in a private namespace, for instance) and sends none back, so neither
# the stacked /usr nor anything a container or a hook mounts reaches the caller: a test that
# compares its own mount table before and after does not see such a leak either.
# sid's crun, like Debian 12's, refuses a cgroup v1 host whose cgroup2 hierarchy holds a
# controller ("cgroups in hybrid mode not supported"); it runs under cgroup v2.
#
# Which versions: the runc and crun that sid has now (printed, and written to
# .engines/sid-root/.nvhook-versions); Debian's mirror keeps only sid's current upload. The
# root is kept once its stamp (.nvhook-runtimes: each package and its version) names this
# package set: `rm -rf .engines/sid-root` takes sid's newer ones.
#
# Run as root (debootstrap, chroot and the wrappers' mounts need it). Any failure stops it with
# one line that names the cause.
#
#   NVHOOK_SID_ROOT       where the root lives (default: .engines/sid-root)
#   NVHOOK_DEBIAN_MIRROR  Debian mirror (default: the one the system's apt sources use)
set -euo pipefail
cd "$(dirname "$0")/.."
fail() {
  echo "sid-runtimes: $*" >&2
  exit 1
}
. scripts/sid-apt.sh

ENGINES=$PWD/.engines
ROOT=$(realpath -m "${NVHOOK_SID_ROOT:-$ENGINES/sid-root}")
BIN=$ENGINES/sid-bin
PACKAGES="runc crun podman"
STAMP=$ROOT/.nvhook-runtimes
VERSIONS=$ROOT/.nvhook-versions
LOG=$ENGINES/sid-runtimes.log

[ "$(id -u)" = 0 ] || fail "run as root (debootstrap, chroot and the wrappers' mounts need it)"
# The path goes into the overlay's mount options, where ',' and ':' separate, and into the
# wrappers' shell text.
[[ $ROOT =~ ^/[A-Za-z0-9._/+@-]+$ ]] ||
  fail "NVHOOK_SID_ROOT=$ROOT: use a path of letters, digits and ._/+@- only (it goes into overlay mount options)"

# wrapper NAME PATH: the text of the wrapper that runs the root's PATH.
wrapper() {
  cat <<EOF
#!/bin/sh
# Debian sid's $1, from the root $ROOT, written by scripts/sid-runtimes.sh (see there).
# unshare and sh exec in place: $1 keeps this process's pid, stdio and exit status.
exec unshare --mount --propagation slave -- /bin/sh -c '
  [ -x "\$0$2" ] || { echo "sid-bin/$1: \$0$2 is missing: run scripts/sid-runtimes.sh" >&2; exit 127; }
  said=\$(mount -t overlay -o ro,lowerdir="\$0/usr:/usr" nvhook-sid-usr /usr 2>&1) ||
    { echo "sid-bin/$1: cannot stack \$0/usr over /usr in a private mount namespace:" \$said >&2; exit 125; }
  [ -z "\${NVHOOK_SID_USER:-}" ] || exec setpriv --reuid="\$NVHOOK_SID_USER" --regid="\$NVHOOK_SID_USER" --init-groups -- $2 "\$@"
  exec $2 "\$@"' '$ROOT' "\$@"
EOF
}

# Rewritten only when its text changed, and by rename: a test may be running it.
write_wrappers() {
  local name path
  mkdir -p "$BIN"
  for name in runc crun podman; do
    case $name in
      runc) path=/usr/sbin/runc ;;
      crun) path=/usr/bin/crun ;;
      podman) path=/usr/bin/podman ;;
    esac
    [ -x "$ROOT$path" ] || fail "the root $ROOT has no $path (package $name)"
    if [ "$(cat "$BIN/$name" 2>/dev/null)" != "$(wrapper $name $path)" ]; then
      wrapper $name $path >"$BIN/$name.new"
      chmod 755 "$BIN/$name.new"
      mv "$BIN/$name.new" "$BIN/$name"
    fi
  done
}

current() {
  [ -s "$STAMP" ] && [ -s "$VERSIONS" ] &&
    [ "$(tr ' ' '\n' <"$STAMP" | sed 's/=.*//' | tr '\n' ' ')" = "$PACKAGES " ]
}

said() {
  echo "sid-runtimes: $(head -1 "$VERSIONS" | sed 's/ version / /'), $(sed -n '/^crun /{s/ version / /;p;q}' "$VERSIONS"), $(sed -n '/^podman /{s/ version / /;p;q}' "$VERSIONS") (Debian sid $(cat "$STAMP")) in $ROOT, run by $BIN/runc, crun and podman$*"
}

if current; then
  write_wrappers
  said
  exit 0
fi
mkdir -p "$ENGINES" "$(dirname "$ROOT")"
# One root at a time (two test runs may start together).
exec 9>"$ROOT.lock"
flock 9
if current; then
  write_wrappers
  said
  exit 0
fi

command -v debootstrap >/dev/null || fail "debootstrap is missing: apt-get install -y debootstrap"
command -v unshare >/dev/null || fail "unshare is missing: apt-get install -y util-linux"
grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null ||
  fail "this kernel has no overlay filesystem (the wrappers stack the root's /usr with it)"
started=$(date +%s)
: >"$LOG"
MIRROR=$(debian_mirror)
# A root from an interrupted run is made again: its marker is written last.
if [ ! -x "$ROOT/usr/bin/apt-get" ] || [ ! -f "$ROOT/.nvhook-debootstrap" ]; then
  rm -rf "$ROOT"
  debootstrap --variant=minbase sid "$ROOT" "$MIRROR" >>"$LOG" 2>&1 ||
    fail "debootstrap --variant=minbase sid $ROOT $MIRROR failed (network? see $LOG): $(grep -m1 -E '^(E|W):' "$LOG" || tail -1 "$LOG")"
  touch "$ROOT/.nvhook-debootstrap"
fi

# The host's resolver, for apt in the root.
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
export DEBIAN_FRONTEND=noninteractive
APT=(-o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false -o APT::Sandbox::User=root -qq)
chroot "$ROOT" apt-get "${APT[@]}" update >>"$LOG" 2>&1 ||
  fail "apt-get update in $ROOT failed (network? see $LOG): $(grep -m1 -E '^(E|W):' "$LOG" || tail -1 "$LOG")"
# shellcheck disable=SC2086
chroot "$ROOT" apt-get "${APT[@]}" install -y $PACKAGES >>"$LOG" 2>&1 ||
  fail "apt-get install $PACKAGES in $ROOT failed (see $LOG): $(grep -m1 -E '^E:' "$LOG" || tail -1 "$LOG")"
chroot "$ROOT" apt-get "${APT[@]}" clean
write_wrappers

# Through the wrappers: what the tests will run.
runc_said=$("$BIN/runc" --version 2>&1) || fail "sid's runc does not run here: $(echo $runc_said)"
crun_said=$("$BIN/crun" --version 2>&1) || fail "sid's crun does not run here: $(echo $crun_said)"
podman_said=$("$BIN/podman" --version 2>&1) || fail "sid's podman does not run here: $(echo $podman_said)"
printf '%s\n%s\n%s\n' "$runc_said" "$crun_said" "$podman_said" >"$VERSIONS"
for package in $PACKAGES; do
  version=$(chroot "$ROOT" dpkg-query -W -f '${Version}' "$package") || fail "dpkg-query $package in $ROOT failed"
  printf '%s=%s\n' "$package" "$version"
done | paste -sd' ' >"$STAMP.new"
mv "$STAMP.new" "$STAMP"
echo "$runc_said"
echo "$crun_said"
echo "$podman_said"
said ", made in $(($(date +%s) - started))s"
