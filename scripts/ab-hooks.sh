#!/usr/bin/env bash
# Two builds of the prestart hook alone, taking turns on one bundle (docs/performance.md, the
# A/B rig of the thirty-third to thirty-fifth rounds): a change's cost or gain, against the same
# VM at the same moment.
#
#   sudo scripts/ab-hooks.sh A/nvhook B/nvhook    # each with its nvhook-nvml beside it
#
# On a simulated 8-GPU node, a compute,utility container of busybox's `true` on every GPU. Each
# build has its own copy of the config and its own NVML answer and kept files (a kept config or
# search is kept for one program, and the builds would otherwise replace each other's), made
# before the timed starts and settled. The builds alternate, in both orders. Every hook runs
# under a small timer that waits for it with wait4, so its whole process is counted: exec,
# glibc's start, the hook's work and its exit. The p50 of each step of the hooks' own log
# lines, of what they read and decide (without `state`, the wait for runc's stdin), and of
# each process's wall time, CPU and page faults are printed for A and B.
# Needs root, runc, cc, python3, busybox-static. STARTS sets the starts per build (200);
# LIBRARIES=N lists N libraries other than the driver's in the node's loader cache (0), as a real
# host's cache lists every library of the system.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require.sh
require_root ab-hooks "it runs runc containers"
require_rust ab-hooks
require_programs ab-hooks runc cc python3 /bin/busybox
[ $# = 2 ] && [ -x "$1" ] && [ -x "$2" ] || {
  echo "usage: $0 NVHOOK_A NVHOOK_B (two nvhook builds, each with its nvhook-nvml beside it)" >&2
  exit 2
}
a=$(realpath "$1")
b=$(realpath "$2")
starts=${STARTS:-200}
cargo build --release -p simnode -p mock-nvml
bin=$(realpath "${CARGO_TARGET_DIR:-target}/release")
work=$(mktemp -d /dev/shm/nvhook-ab-hooks.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$bin/simnode" create "$work/node" --gpus 8 --other-libraries "${LIBRARIES:-0}" >/dev/null
sed -i -e 's/^log-level = .*/log-level = "info"/' "$work/node/config.toml"
for x in A B; do
  sed -e "s|^nvml-cache-file = .*|nvml-cache-file = \"$work/node/run-$x/nvml-inventory.json\"|" \
    "$work/node/config.toml" >"$work/node/config-$x.toml"
done

cat >"$work/timer.c" <<'C'
/* timer RECORD PROGRAM ARGV...: runs PROGRAM with this stdin, waits with wait4, appends
   "wall=US cpu=US faults=N" to RECORD, and exits with its status. */
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
  struct timespec start, end;
  struct rusage usage;
  int status;
  if (argc < 4) return 2;
  clock_gettime(CLOCK_MONOTONIC, &start);
  pid_t pid = fork();
  if (pid == 0) {
    execv(argv[2], argv + 3);
    _exit(127);
  }
  wait4(pid, &status, 0, &usage);
  clock_gettime(CLOCK_MONOTONIC, &end);
  FILE *record = fopen(argv[1], "a");
  if (!record) return 1;
  fprintf(record, "wall=%.0f cpu=%.0f faults=%ld\n",
          (end.tv_sec - start.tv_sec) * 1e6 + (end.tv_nsec - start.tv_nsec) / 1e3,
          usage.ru_utime.tv_sec * 1e6 + usage.ru_utime.tv_usec + usage.ru_stime.tv_sec * 1e6 +
              usage.ru_stime.tv_usec,
          usage.ru_minflt);
  fclose(record);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
C
cc -O2 -o "$work/timer" "$work/timer.c"

mkdir -p "$work/bundle/rootfs/bin"
cp /bin/busybox "$work/bundle/rootfs/bin/busybox"
ln -s busybox "$work/bundle/rootfs/bin/true"
cp -a "$work/bundle/rootfs" "$work/rootfs.orig"
(cd "$work/bundle" && runc spec)
python3 - "$work" "$a" "$b" <<'PY'
import json, sys
work, a, b = sys.argv[1:]
spec = json.load(open(f"{work}/bundle/config.json"))
spec["process"]["terminal"] = False
spec["process"]["args"] = ["true"]
spec["process"]["env"] += ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
for x, hook in (("A", a), ("B", b)):
    args = ["timer", f"{work}/record", hook, "nvhook", "--config", f"{work}/node/config-{x}.toml",
            "hook", "prestart"]
    spec["hooks"] = {"prestart": [{"path": f"{work}/timer", "args": args}]}
    json.dump(spec, open(f"{work}/bundle/config.json.{x}", "w"))
PY

log="$work/node/nvhook.log"
start() {
  rm -rf "$work/bundle/rootfs"
  cp -a "$work/rootfs.orig" "$work/bundle/rootfs"
  cp "$work/bundle/config.json.$1" "$work/bundle/config.json"
  (cd "$work/bundle" && runc run "ab-hooks-$$" >/dev/null)
}
# A node's first start asks NVML and keeps what it read, once the node's files are older than
# the two seconds a kept config or search needs to tell a later change by their times.
sleep 3
start A
start B
: >"$log"
for i in $(seq "$starts"); do
  order="A B"
  [ $((i % 2)) = 1 ] && order="B A"
  for x in $order; do
    start "$x"
    { tail -n 1 "$work/record"; echo "build=$x"; } >>"$log"
  done
done

python3 - "$log" "$starts" <<'PY'
import re, statistics, sys
READS = ["process", "request", "image", "inventory", "plan"]
runs = {"A": {}, "B": {}}
steps = process = None
for line in open(sys.argv[1]):
    m = re.search(r"steps: (.*)", line)
    if m:
        steps = dict(part.split("=") for part in m.group(1).split())
    elif line.startswith("wall="):
        process = dict(part.split("=") for part in line.split())
    elif line.startswith("build=") and steps and process:
        values = {k: int(v) for k, v in {**steps, **process}.items()}
        values["reads and decides, without state"] = sum(values.get(s, 0) for s in READS)
        for name, value in values.items():
            runs[line.strip()[6:]].setdefault(name, []).append(value)
        steps = process = None
print(f"p50 of {sys.argv[2]} hooks alone per build (µs; faults: minor page faults)")
print(f"{'':36} {'A':>8} {'B':>8}")
for name in runs["A"]:
    a, b = (statistics.median(runs[x].get(name, [0])) for x in "AB")
    print(f"{name:36} {a:8.0f} {b:8.0f}")
PY
