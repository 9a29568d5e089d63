#!/usr/bin/env bash
# What the prestart hook alone spends reading the host and deciding, against the kernel's share
# of it (docs/performance.md, thirty-third round). On a simulated 8-GPU node, a compute,utility
# container on every GPU: STARTS hooks are run as runc runs them, and their step lines give what
# nvhook reads and decides (the steps before the container is touched). One more hook runs under
# strace; the file system calls it made in those steps are then replayed alone, in a loop, with
# nothing parsed or decided, and the capability calls a hook makes are timed the same way.
# Needs root, runc, strace, cc, python3, busybox-static.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require.sh
require_root reads-floor "it runs runc containers"
require_rust reads-floor
require_programs reads-floor runc strace cc python3 /bin/busybox

starts=${STARTS:-200}
cargo build --release --workspace
bin=$(realpath "${CARGO_TARGET_DIR:-target}/release")
work=$(mktemp -d /dev/shm/nvhook-reads-floor.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$bin/simnode" create "$work/node" --gpus 8 >/dev/null
config="$work/node/config.toml"
sed -i -e 's/^log-level = .*/log-level = "info"/' "$config"

mkdir -p "$work/bundle/rootfs/bin"
cp /bin/busybox "$work/bundle/rootfs/bin/busybox"
ln -s busybox "$work/bundle/rootfs/bin/true"
cp -a "$work/bundle/rootfs" "$work/rootfs.orig"
(cd "$work/bundle" && runc spec)
python3 - "$work/bundle/config.json" "$bin/nvhook" "$config" "$work/strace.out" <<'PY'
import json, sys
path, hook, config, trace = sys.argv[1:]
spec = json.load(open(path))
spec["process"]["terminal"] = False
spec["process"]["args"] = ["true"]
spec["process"]["env"] += ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
args = ["nvhook", "--config", config, "hook", "prestart"]
spec["hooks"] = {"prestart": [{"path": hook, "args": args}]}
json.dump(spec, open(path + ".hook", "w"))
spec["hooks"] = {"prestart": [{"path": "/usr/bin/strace", "args": ["strace", "-o", trace, hook] + args[1:]}]}
json.dump(spec, open(path + ".strace", "w"))
PY

start() {
  rm -rf "$work/bundle/rootfs"
  cp -a "$work/rootfs.orig" "$work/bundle/rootfs"
  cp "$work/bundle/config.json.$1" "$work/bundle/config.json"
  (cd "$work/bundle" && runc run "reads-floor-$$" >/dev/null)
}
# The first start asks NVML and keeps its answer and the driver's files, as a node's first does:
# once the node's directories are older than the two seconds a kept search needs to tell a
# later change by their times.
sleep 3
start hook
: > "$work/node/nvhook.log"
for _ in $(seq "$starts"); do start hook; done
start strace

cat > "$work/replay.c" <<'C'
/* replay OPS N: the system calls in OPS (one a line: call dirfd arg fd path), N times; the
   median of a pass, in microseconds. Descriptors are named by the numbers the traced hook had. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
struct op { char call[16]; int dirfd; long arg; int fd; char path[512]; };
static struct op ops[8192];
static int fds[1024];
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int at(int dirfd) { return dirfd < 0 ? AT_FDCWD : fds[dirfd]; }
static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
int main(int argc, char **argv) {
  FILE *in = fopen(argv[1], "r");
  int n = atoi(argv[2]), count = 0;
  char line[1024];
  while (count < 8192 && fgets(line, sizeof line, in)) {
    struct op *o = &ops[count];
    if (sscanf(line, "%15s %d %ld %d %511s", o->call, &o->dirfd, &o->arg, &o->fd, o->path) == 5) {
      if (!strcmp(o->path, "-")) o->path[0] = 0;
      count++;
    }
  }
  static char buf[1 << 16];
  double *pass = malloc(sizeof(double) * n);
  struct statx sx;
  struct statfs sf;
  for (int i = 0; i < n; i++) {
    double t = now();
    for (int k = 0; k < count; k++) {
      struct op *o = &ops[k];
      if (!strcmp(o->call, "open")) fds[o->fd] = openat(at(o->dirfd), o->path, (int)o->arg, 0644);
      else if (!strcmp(o->call, "statx"))
        statx(at(o->dirfd), o->path, (int)o->arg | (o->path[0] ? 0 : AT_EMPTY_PATH), STATX_ALL, &sx);
      else if (!strcmp(o->call, "read")) (void)!read(fds[o->fd], buf, o->arg < (long)sizeof buf ? o->arg : (long)sizeof buf);
      else if (!strcmp(o->call, "getdents")) syscall(SYS_getdents64, fds[o->fd], buf, 32768);
      else if (!strcmp(o->call, "close")) close(fds[o->fd]);
      else if (!strcmp(o->call, "readlink")) (void)!readlinkat(at(o->dirfd), o->path, buf, 1023);
      else if (!strcmp(o->call, "statfs")) statfs(o->path, &sf);
      else if (!strcmp(o->call, "geteuid")) geteuid();
      else if (!strcmp(o->call, "lseek")) lseek(fds[o->fd], 0, SEEK_CUR);
    }
    pass[i] = now() - t;
  }
  qsort(pass, n, sizeof(double), by_value);
  printf("%d calls: %.0f us a pass (median of %d)\n", count, pass[n / 2], n);
  return 0;
}
C
cat > "$work/caps.c" <<'C'
/* The calls a hook makes to drop capabilities, each timed over many calls (as root). */
#define _GNU_SOURCE
#include <linux/capability.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
int main(int argc, char **argv) {
  int n = 20000, drops, gets, sets;
  sscanf(argv[1], "%d", &drops);
  sscanf(argv[2], "%d", &gets);
  sscanf(argv[3], "%d", &sets);
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  double t = now();
  for (int i = 0; i < n; i++) prctl(PR_CAPBSET_DROP, CAP_SYS_BOOT, 0, 0, 0);
  double drop = (now() - t) / n;
  t = now();
  for (int i = 0; i < n; i++) syscall(SYS_capget, &h, d);
  double get = (now() - t) / n;
  t = now();
  for (int i = 0; i < n; i++) syscall(SYS_capset, &h, d);
  double set = (now() - t) / n;
  printf("%d capability calls: %.0f us (PR_CAPBSET_DROP %.2f us, capget %.2f, capset %.2f)\n",
         drops + gets + sets, drops * drop + gets * get + sets * set, drop, get, set);
  return 0;
}
C
cc -O2 -o "$work/replay" "$work/replay.c"
cc -O2 -o "$work/caps" "$work/caps.c"

# The traced hook's calls from its config's read to its cgroup step's first read, the first
# step that touches the container: the file calls to replay, and the capability calls to count.
python3 - "$work/strace.out" "$config" "$work/ops" "$work/capcalls" <<'PY'
import os, re, sys
trace, config, out, capcalls = sys.argv[1:]
lines = open(trace).read().splitlines()
# The config's first look: a statx where a kept config is read, an open where it is parsed.
begin = next(i for i, l in enumerate(lines) if f'"{config}"' in l)
end = next(i for i, l in enumerate(lines) if i > begin and re.search(r'"/proc/\d+/cgroup"', l))
AT = {"AT_SYMLINK_NOFOLLOW": 0x100, "AT_EMPTY_PATH": 0x1000}
def flags(text):
    return sum(getattr(os, f, AT.get(f, 0)) for f in text.split("|"))
def fd(text):
    return -1 if text == "AT_FDCWD" else int(text)
ops, caps = [], {"prctl": 0, "capget": 0, "capset": 0}
for line in lines[begin:end]:
    m = re.match(r"(\w+)\((.*)\)\s+=\s+(-?\d+)", line)
    if not m:
        continue
    call, args, ret = m.group(1), re.sub(r"/proc/\d+/", "/proc/self/", m.group(2)), int(m.group(3))
    path = re.search(r'"([^"]*)"', args)
    path = (path.group(1) if path else "") or "-"
    first = args.split(",")[0]
    if call == "openat":
        ops.append(f"open {fd(first)} {flags(args.split(', ')[2])} {ret if ret >= 0 else 1023} {path}")
    elif call == "openat2":
        ops.append(f"open {fd(first)} {os.O_PATH | os.O_CLOEXEC} {ret if ret >= 0 else 1023} {path}")
    elif call in ("statx", "newfstatat"):
        at = args.split(", ")[2] if call == "statx" else args.split(", ")[-1]
        ops.append(f"statx {fd(first)} {flags(at)} 0 {path}")
    elif call == "read" and first == "0":
        continue  # the runtime's state, on the hook's stdin
    elif call == "read":
        ops.append(f"read 0 {args.rsplit(', ', 1)[1]} {first} -")
    elif call in ("getdents64", "close", "lseek"):
        ops.append(f"{call.replace('64', '')} 0 0 {first} -")
    elif call in ("readlink", "statfs"):
        ops.append(f"{call} -1 0 0 {path}")
    elif call == "geteuid":
        ops.append("geteuid 0 0 0 -")
    elif call in caps:
        caps[call] += 1
open(out, "w").write("\n".join(ops) + "\n")
open(capcalls, "w").write(f"{caps['prctl']} {caps['capget']} {caps['capset']}\n")
PY

echo "== what $starts hooks alone read and decided (p50 of their step lines, µs) =="
python3 - "$work/node/nvhook.log" <<'PY'
import re, statistics, sys
READS = ["process", "state", "request", "image", "inventory", "plan"]
steps = {}
for line in open(sys.argv[1]):
    m = re.search(r"steps: (.*)", line)
    if m:
        for part in m.group(1).split():
            name, us = part.split("=")
            steps.setdefault(name, []).append(int(us))
totals = [sum(v) for v in zip(*(steps[s] for s in READS))]
print(" ".join(f"{s}={statistics.median(steps[s]):.0f}" for s in READS),
      f"| reads and decides {statistics.median(totals):.0f}")
PY
echo "== the same steps' system calls alone =="
"$work/replay" "$work/ops" 2000
read -r drops gets sets < "$work/capcalls"
"$work/caps" "$drops" "$gets" "$sets"
