#!/usr/bin/env bash
# What a createRuntime hook's arguments cost runc alone, inline in config.json against the
# `--args-file PATH SUM` form (docs/performance.md, forty-second round). Two busybox bundles on
# /dev/shm differ only in the hook's arguments: ARGS_FILE's lines inline, or the three of the file
# form. The hook is /bin/true, so nothing but runc's handling of the spec differs. `runc run`
# starts each in turns, ROUNDS times; printed: wall and CPU (runc, its children and the hook)
# p50, and the paired medians of file − inline.
# Usage: sudo scripts/hook-args-rig.sh ARGS_FILE [RUNC] [ROUNDS]
#   ARGS_FILE: a file of nvhook's state directory (`/run/nvhook/hook-args/SUM.args`), one
#   argument a line; RUNC: runc by default (e.g. .engines/sid-bin/runc); ROUNDS: 300.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require.sh
require_root hook-args-rig "it runs runc containers"
require_programs hook-args-rig python3 /bin/busybox
[ $# -ge 1 ] && [ -f "$1" ] || { echo "hook-args-rig: usage: $0 ARGS_FILE [RUNC] [ROUNDS]" >&2; exit 2; }
args_file=$(realpath "$1")
runc=${2:-runc}
# Absolute: `runc spec` runs in the bundle's directory.
runc=$(command -v "$runc" 2>/dev/null) && runc=$(realpath "$runc") ||
  { echo "hook-args-rig: ${2:-runc} not found: install runc or name one" >&2; exit 1; }
work=$(mktemp -d /dev/shm/nvhook-hook-args-rig.XXXXXX)
trap 'rm -rf "$work"' EXIT

python3 - "$args_file" "$runc" "${3:-300}" "$work" <<'EOF'
import json, os, resource, shutil, statistics, subprocess, sys, time

args_file, runc, rounds, work = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
inline = open(args_file).read().splitlines()
prefix = ["nvhook", "hook", "createRuntime"]
sum_ = os.path.basename(args_file).split(".")[0]
forms = {"inline": prefix + inline, "file": prefix + ["--args-file", args_file, sum_]}

for form, hook_args in forms.items():
    bundle = f"{work}/{form}"
    os.makedirs(f"{bundle}/rootfs/bin")
    shutil.copy("/bin/busybox", f"{bundle}/rootfs/bin/busybox")
    os.symlink("busybox", f"{bundle}/rootfs/bin/true")
    subprocess.run([runc, "spec"], cwd=bundle, check=True)
    with open(f"{bundle}/config.json") as f:
        spec = json.load(f)
    spec["process"].update(args=["/bin/true"], terminal=False)
    spec["hooks"] = {"createRuntime": [{"path": "/bin/true", "args": hook_args}]}
    # Compact, as containerd writes a bundle's spec.
    with open(f"{bundle}/config.json", "w") as f:
        json.dump(spec, f, separators=(",", ":"))
    print(f"{form}: {len(hook_args)} hook arguments, config.json {os.path.getsize(f'{bundle}/config.json')} bytes")

def cpu_ms():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1e3

wall, cpu = {f: [] for f in forms}, {f: [] for f in forms}
for r in range(rounds):
    for form in (list(forms) if r % 2 == 0 else list(forms)[::-1]):
        cpu_before, started = cpu_ms(), time.perf_counter()
        subprocess.run([runc, "run", "--bundle", f"{work}/{form}", f"hook-args-rig-{os.getpid()}-{form}"],
                       check=True, stdin=subprocess.DEVNULL)
        wall[form].append((time.perf_counter() - started) * 1e3)
        cpu[form].append(cpu_ms() - cpu_before)

for name, samples in (("wall", wall), ("CPU", cpu)):
    p50 = {f: statistics.median(s) for f, s in samples.items()}
    paired = statistics.median(a - b for a, b in zip(samples["file"], samples["inline"]))
    print(f"{name}: inline p50 {p50['inline']:.2f} ms, file p50 {p50['file']:.2f} ms, "
          f"file − inline paired median {paired:+.2f} ms ({rounds} rounds)")
EOF
