#!/usr/bin/env bash
# Regenerates tests/fixtures/nvidia-programs/transcripts.json: what NVIDIA's own
# `nvidia-cdi-hook` and `nvidia-container-runtime-hook` answer to a table of command lines
# (version, help, usage errors, unknown hooks, hooks with nothing to do). tests/nvidia_programs.rs
# runs nvhook, linked under the same names, on the same inputs and compares.
#
# Usage: scripts/nvidia-transcripts.sh BINDIR
#   BINDIR holds NVIDIA's nvidia-cdi-hook and nvidia-container-runtime-hook (the fixture was
#   made from tag v1.20.0; see tests/fixtures/nvidia-programs/README.md for how they were built).
#
# Each program runs with an empty environment (PATH only), stdin /dev/null or the row's OCI
# state, stderr a file (so logrus writes plain `time=... level=... msg=...` lines), in a scratch
# directory. The one bundle a state names is made in a temporary directory: config.json as the
# fixture gives it, an empty rootfs/. The state and the bundle are written into the fixture
# (the bundle's path as @BUNDLE@), so the test gives nvhook the same input.
# Needs jq. Any failure stops it with one line that names the cause.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "nvidia-transcripts: $*" >&2
  exit 1
}

[ $# -eq 1 ] || fail "usage: $0 BINDIR (the directory of NVIDIA's nvidia-cdi-hook and nvidia-container-runtime-hook)"
BINDIR=$(cd "$1" 2>/dev/null && pwd) || fail "$1 is not a directory"
for program in nvidia-cdi-hook nvidia-container-runtime-hook; do
  [ -x "$BINDIR/$program" ] || fail "$BINDIR/$program is missing or not executable"
done
command -v jq >/dev/null || fail "jq is missing (apt-get install jq)"

OUT=$PWD/tests/fixtures/nvidia-programs
WORK=$(mktemp -d /tmp/nvidia-transcripts.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
started=$(date +%s)

cdi_said=$(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$BINDIR/nvidia-cdi-hook" --version 2>&1 </dev/null | head -1) ||
  fail "$BINDIR/nvidia-cdi-hook --version does not run: $cdi_said"
case $cdi_said in
"NVIDIA CDI Hook version "*) ;;
*) fail "$BINDIR/nvidia-cdi-hook --version says \"$cdi_said\", not NVIDIA CDI Hook version ..." ;;
esac

# The bundle of the rows that read a state: config.json and an empty rootfs/.
BUNDLE_CONFIG='{"ociVersion":"1.0.2","process":{"args":["true"],"cwd":"/","env":["PATH=/usr/bin:/bin"]},"root":{"path":"rootfs"}}'
STATE='{"ociVersion":"1.0.2","id":"nvidia-programs","status":"creating","pid":1,"bundle":"@BUNDLE@"}'
BUNDLE=$WORK/bundle
mkdir -p "$BUNDLE/rootfs" "$WORK/cwd"
jq . <<<"$BUNDLE_CONFIG" >"$BUNDLE/config.json" || fail "BUNDLE_CONFIG is not JSON"
jq . <<<"${STATE//@BUNDLE@/$BUNDLE}" >/dev/null || fail "STATE is not JSON"

# run PROGRAM STDIN ARGS...: one row of the fixture (a JSON object) in $WORK/rows/.
# STDIN is `none` (/dev/null) or `state` ($STATE, the bundle at $BUNDLE).
rows=0
mkdir -p "$WORK/rows"
run() {
  local program=$1 stdin=$2 status=0 input=/dev/null
  shift 2
  if [ "$stdin" = state ]; then
    input=$WORK/stdin
    printf '%s' "${STATE//@BUNDLE@/$BUNDLE}" >"$input"
    rm -rf "$BUNDLE/rootfs"
    mkdir "$BUNDLE/rootfs"
  fi
  (cd "$WORK/cwd" && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin timeout 30 "$BINDIR/$program" "$@" \
    <"$input" >"$WORK/stdout" 2>"$WORK/stderr") || status=$?
  [ "$status" -ne 124 ] || fail "$program $* ran for 30s: killed"
  sed -i "s#$BUNDLE#@BUNDLE@#g" "$WORK/stdout" "$WORK/stderr"
  # What the program left in the bundle's rootfs, one path a line.
  : >"$WORK/rootfs"
  [ "$stdin" != state ] || (cd "$BUNDLE/rootfs" && find . -mindepth 1 | sed 's#^\./##' | LC_ALL=C sort) >"$WORK/rootfs"
  # stderr: logrus's `time="..." level=L msg="M"` becomes `L: M` (M unquoted), blank lines go;
  # Go's flag usage (from `Usage of PROGRAM:` on) is left out, its first line kept apart.
  local row args='[]'
  [ $# -eq 0 ] || args=$(printf '%s\n' "$@" | jq -R . | jq -sc .) || fail "jq could not quote $program $*"
  row=$(jq -n --arg program "$program" --argjson args "$args" --argjson status "$status" --arg stdin "$stdin" \
    --arg state "$STATE" --argjson bundle "$BUNDLE_CONFIG" \
    --rawfile stdout "$WORK/stdout" --rawfile stderr "$WORK/stderr" --rawfile rootfs "$WORK/rootfs" '
    def lines: if . == "" then [] else rtrimstr("\n") | split("\n") end;
    def unlogrus:
      if test("^time=\"[^\"]*\" level=[a-z]+ msg=")
      then capture("^time=\"[^\"]*\" level=(?<level>[a-z]+) msg=(?<msg>.*)$")
        | "\(.level): \(.msg | if startswith("\"") then fromjson else . end)"
      else . end;
    [$stderr | lines[] | unlogrus | select(. != "")] as $said
    | ([$said | to_entries[] | select(.value | startswith("Usage of ")) | .key] | first) as $usage
    | {
      program: $program,
      args: $args,
      stdin: (if $stdin == "state" then $state else null end),
      bundle: (if $stdin == "state" then {"config.json": $bundle} else null end),
      exit: $status,
      stdout_empty: ($stdout == ""),
      stdout_first_line: ($stdout | lines | first // null),
      stderr: (if $usage then $said[:$usage] else $said end),
      stderr_usage: (if $usage then $said[$usage] else null end),
      rootfs_after: (if $stdin == "state" then $rootfs | lines else null end)
    }') || fail "jq could not record $program $*"
  printf '%s\n' "$row" >"$WORK/rows/$(printf '%03d' $rows).json"
  rows=$((rows + 1))
}

# --- nvidia-cdi-hook ---------------------------------------------------------------------------
cdi() { run nvidia-cdi-hook "$@"; }
cdi none --version
cdi none -v
cdi none -version
cdi none --help
cdi none -h
cdi none help
cdi none h
cdi none
cdi none apply-cuda-memory-limits --driver-root / --gpu-id GPU-x
cdi none foo
cdi none --bogus
cdi none --bogus update-ldcache
cdi none foo --bogus
cdi none update-ldcache --bogus
cdi none update-ldcache --help
cdi none create-symlinks --help
cdi none enable-cuda-compat
cdi state enable-cuda-compat --host-driver-version=latest
cdi none noop
cdi none noop stray

# --- nvidia-container-runtime-hook ---------------------------------------------------------------
rt() { run nvidia-container-runtime-hook "$@"; }
rt none -version
rt none --version
rt none -v
rt none -h
rt none --help
rt none
rt none create
rt none poststart
rt none poststop
rt none -debug
rt none -config

# Sorted by program, then by the arguments; keys sorted; one row a block.
mkdir -p "$OUT"
jq -s -S 'sort_by(.program, .args)' "$WORK"/rows/*.json >"$WORK/transcripts.json" ||
  fail "jq could not gather the rows"
[ "$(jq length "$WORK/transcripts.json")" -eq "$rows" ] || fail "the fixture lost rows"
! grep -q "$WORK" "$WORK/transcripts.json" || fail "the fixture still names $WORK"
mv "$WORK/transcripts.json" "$OUT/transcripts.json"
echo "nvidia-transcripts: $cdi_said: wrote $rows rows to $OUT/transcripts.json in $(($(date +%s) - started))s"
