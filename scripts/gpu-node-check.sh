#!/usr/bin/env bash
# nvhook against a real NVIDIA driver, on a machine that has a GPU but maybe no runc, no
# compiler and no network.
#
#   scripts/gpu-node-check.sh pack DIR   # here: release binaries, runc + libseccomp, a glibc
#                                        # rootfs with gpucheck (the e2e tests' probe)
#   DIR/gpu-node-check.sh run OUT        # there, as root: results and logs go to OUT
#   DIR/gpu-node-check.sh compat OUT     # there: only the CUDA forward-compat check
#   DIR/gpu-node-check.sh nested OUT     # there: only the nested-sandbox check
#   DIR/gpu-node-check.sh memlimits OUT  # there: only the GPU memory limit check
#   DIR/gpu-node-check.sh cdi OUT        # there: only the CDI check
#   DIR/gpu-node-check.sh costs OUT      # there: only the kernel's costs of a CDI view's parts
#
# `run` lists the driver's device nodes (GPUs, caps, IMEX channels, NVSwitch, NVLink) and asks
# for GPU 0 with every capability through each path nvhook offers (runc + the prestart hook,
# nvhook-runtime, nvhook-runtime in runtime-mode = "cdi"); the container dlopens libcuda.so.1,
# calls cuInit, launches a real kernel through the driver API (PTX JIT-compiled, launched, the
# result copied back and checked), probes the device nodes and runs the mounted nvidia-smi. Then it
# times whole starts (`runc run` of /bin/true) for plain runc and both hook paths, alternating,
# with NVML's answer cached (the default) and queried on every start. Each timed start gets a
# new empty layer over the image, as an engine's snapshotter gives each container.
#
# The CUDA forward-compat check (part of `run`, or alone) takes each CUDA compat directory the
# host has (/usr/local/cuda/compat, /usr/local/cuda-*/compat; COMPAT_DIRS overrides), copies it
# into a copy of the kit's rootfs at /usr/local/cuda/compat, as CUDA images carry it, and shows
# nvhook's choice: `nvhook plan`'s CUDA compat lines (host driver vs compat driver, which
# libraries), then the file the container's loader resolves libcuda.so.1 to, and a kernel run.
# The nested-sandbox check (part of `run`, or alone) runs, as uid 1000 in a GPU container,
# `unshare -Urpf --mount-proc` (what bubblewrap and Slurm's containers do): with runc's default
# masked paths, and with /proc unmasked (Kubernetes `procMount: Unmasked`) under
# proc-driver-view = "always" (nvhook's /proc/driver/nvidia view mounted) and "auto" (left out
# for unmasked containers), and lists the /proc/driver/nvidia/gpus each container sees.
# The GPU memory limit check (part of `run`, or alone) asks the driver to limit a cgroup's GPU 0
# memory (nvmlDeviceSetMemoryLimits_v1 through nvhook-nvml) and prints its answer: SUCCESS,
# NOT_SUPPORTED, or no such call (a driver before CUDA 13.4's); where it limits, a container
# with NVIDIA_GPU_MEMORY_LIMIT=1024 (MiB) through the prestart hook allocates 256 MiB and is
# refused 2 GiB (cuMemAlloc), and the same container without a limit allocates both.
# The CDI check (part of `run`, or alone) writes nvhook's spec for this node (`nvhook cdi
# generate`, kept as OUT/nvidia.json), applies GPU 0's edits to a bundle as a CDI-aware engine
# does (device nodes, env, the createRuntime hook), and runs the kernel probe through it in an
# image without a loader cache, then in one with. Then it times whole starts, alternating:
# plain runc, the floor (the spec's device nodes and env alone), the floor with a createRuntime
# hook running /bin/true, the whole spec on each of the two images, and the prestart hook with
# every capability (p50 and p95), and gives the p50 of each hook step. OTHER_NVHOOK=PATH adds
# the spec's start with its hook run by another nvhook build, its arguments inline in the spec
# (as builds before the argument file read them), in the same loop (an A/B), and
# the medians of each round's differences: whole starts, both builds over the floor with a
# hook, and each hook step.
# The costs check (part of `run`, or alone) times, in a private mount namespace on the kit's
# disk, each piece of kernel work a driver file's view in a new layer is made of (directories,
# files and links in an overlay layer, in ext4 and in a tmpfs; a file's clone, seal and attach;
# a new tmpfs and its attach; a lower directory's copy-up): the median of 200 each, in µs.
# NVHOOK_EXTRA_CONFIG: lines added to every config (e.g. driver-root for a driver elsewhere).
set -euo pipefail

pack() {
  local kit=$1 repo
  repo=$(cd "$(dirname "$0")/.." && pwd)
  (cd "$repo" && cargo build --release --bins --quiet -p nvhook -p nvhook-runtime -p nvhook-nvml)
  rm -rf "$kit"
  mkdir -p "$kit/bin" "$kit/rootfs"/{bin,lib/x86_64-linux-gnu,lib64,etc,usr/bin,proc,dev,sys,tmp}
  cp "$repo/target/release/"{nvhook,nvhook-runtime,nvhook-nvml} "$kit/bin/"
  cp "$(command -v runc)" "$kit/bin/"
  cp /lib/x86_64-linux-gnu/libseccomp.so.2 "$kit/bin/"
  cc -O2 -o "$kit/rootfs/gpucheck" "$repo/tests/gpucheck.c" -ldl
  cp /bin/busybox "$kit/rootfs/bin/"
  for applet in sh true; do ln -s busybox "$kit/rootfs/bin/$applet"; done
  for lib in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libgcc_s.so.1; do
    cp "/lib/x86_64-linux-gnu/$lib" "$kit/rootfs/lib/x86_64-linux-gnu/"
  done
  cp /lib64/ld-linux-x86-64.so.2 "$kit/rootfs/lib64/"
  cp "$0" "$kit/gpu-node-check.sh"
  (cd "$kit" && "$kit/bin/runc" spec && mv config.json spec.json)
  echo "packed $kit ($(du -sh "$kit" | cut -f1))"
}

# fresh_image: $KIT/image, a copy of the packed rootfs for one check's bundles. The hooks write
# into it (mount points, the loader's cache), as into an image's layer; a check that ran before,
# here or on another node, must not leave a stale cache entry that shadows the driver's files.
fresh_image() {
  rm -rf "$KIT/image"
  cp -a "$KIT/rootfs" "$KIT/image"
}

# layer NAME LOWER: $KIT/layers/NAME/root, LOWER (an image's rootfs, left as it is) under a new
# empty layer, made anew before each timed start as an engine's snapshotter gives each container
# (overlayfs). The hooks write into the layer: mount points, links, the loader's cache. Starting
# on the layer a start before left would time another path (files already there, a cache
# replaced). Where overlayfs is refused (the kit on an overlay or tmpfs), the root is a fresh copy.
layer() {
  local dir=$KIT/layers/$1
  if mountpoint -q "$dir/root"; then umount "$dir/root"; fi
  rm -rf "$dir"
  mkdir -p "$dir"/{upper,work,root}
  mount -t overlay overlay -o "lowerdir=$2,upperdir=$dir/upper,workdir=$dir/work" "$dir/root" 2>/dev/null ||
    { rmdir "$dir/root" && cp -a "$2" "$dir/root"; }
}

# drop_layers: unmounts and removes every layer.
drop_layers() {
  local root
  for root in "$KIT"/layers/*/root; do
    if mountpoint -q "$root"; then umount "$root"; fi
  done
  rm -rf "$KIT/layers"
}

# finish: what a check leaves at its exit: no layer, and none of the state it kept (the CDI
# hook's trees are mounts).
finish() {
  drop_layers
  if mountpoint -q "$KIT/state/hook-trees"; then umount --lazy "$KIT/state/hook-trees"; fi
  rm -rf "$KIT/state"
}

# bundle NAME ARGS_JSON ENV_JSON [HOOK]: a bundle on $KIT/image (ROOTFS overrides).
bundle() {
  local dir="$KIT/b-$1"
  mkdir -p "$dir"
  python3 - "$KIT" "$dir/config.json" "$2" "$3" "${4:-}" <<'PY'
import json, os, sys
kit, out, args, env, hook = sys.argv[1:]
spec = json.load(open(f"{kit}/spec.json"))
spec["process"].update(terminal=False, args=json.loads(args))
spec["process"]["env"] += json.loads(env)
spec["root"] = {"path": os.environ.get("ROOTFS", f"{kit}/image"), "readonly": False}
if os.environ.get("AS_USER"):
    spec["process"]["user"] = {"uid": int(os.environ["AS_USER"]), "gid": int(os.environ["AS_USER"])}
if os.environ.get("UNMASKED"):
    spec["linux"]["maskedPaths"] = []
    spec["linux"]["readonlyPaths"] = []
if hook:
    spec["hooks"] = {"prestart": [{"path": f"{kit}/bin/nvhook",
        "args": ["nvhook", "--config", hook, "hook", "prestart"],
        "env": ["PATH=/usr/bin:/bin"], "timeout": 30}]}
json.dump(spec, open(out, "w"))
PY
  rm -f "$dir/nvhook-plan.json"
}

# config NAME EXTRA-LINES: $KIT/NAME.toml. What nvhook keeps between starts (NVML's answer, the
# driver files, the CDI hook's trees) is kept in $KIT/state, not in the machine's /run/nvhook.
config() {
  local state="nvml-cache-file = \"$KIT/state/nvml.json\""
  case $2 in *nvml-cache-file*) state= ;; esac
  cat > "$KIT/$1.toml" <<EOT
log-file = "$OUT/$1.log"
hook-path = "$KIT/bin/nvhook"
runtimes = ["$KIT/bin/runc"]
$state
${NVHOOK_EXTRA_CONFIG:-}
$2
EOT
}

# us COMMAND...: wall microseconds of one run, "FAIL" when it fails.
# paired STARTS LOG: the A/B's per-round differences (each kind's Nth start is round N's):
# this build's whole start against the other's, each over the floor with a hook, and each of
# the hook's steps against the other build's in the same round.
paired() {
  python3 - "$1" "$2" <<'PY'
import re, statistics, sys
starts = {}
for line in open(sys.argv[1]):
    kind, us = line.split()
    starts.setdefault(kind, []).append(int(us) if us.isdigit() else None)
steps, pending = {}, None
for line in open(sys.argv[2]):
    if "steps:" in line:
        pending = {k: int(v) for k, v in (p.split("=") for p in line.split("steps:", 1)[1].split())}
        continue
    found = re.search(r"hook finished .*\bid=(\S+)", line)
    if pending is not None and found:
        steps[found.group(1)] = pending
    pending = None
def median(pairs):
    diffs = [a - b for a, b in pairs if a is not None and b is not None]
    return f"{statistics.median(diffs) / 1000:+.2f}" if diffs else "none"
def against(a, b):
    return median(zip(starts.get(a, []), starts.get(b, [])))
print(f"whole start, this build - the other: {against('cdi', 'cdi-other')}")
print(f"over the floor with a hook: this build {against('cdi', 'cdi-floor-hook')},"
      f" the other {against('cdi-other', 'cdi-floor-hook')}")
rounds = [(steps[f"cdi-{n}"], steps[f"cdi-other-{n}"]) for n in range(1, len(starts.get("cdi", [])) + 1)
          if f"cdi-{n}" in steps and f"cdi-other-{n}" in steps]
names = list(dict.fromkeys(k for mine, _ in rounds for k in mine)) + ["sum"]
total = lambda s, k: sum(s.values()) if k == "sum" else s.get(k)
print("hook steps, this build - the other: "
      + " ".join(f"{k}={median((total(a, k), total(b, k)) for a, b in rounds)}" for k in names))
PY
}

us() {
  local start end
  start=$(date +%s%N)
  "$@" >/dev/null 2>&1 || { echo FAIL; return; }
  end=$(date +%s%N)
  echo $(((end - start) / 1000))
}

# pct N [us]: the Nth percentile (nearest rank) of the microseconds on stdin, in ms (one
# decimal), or with `us` in whole microseconds.
pct() {
  sort -n | awk -v n="$1" -v unit="${2:-ms}" '{a[NR]=$1} END {r=int((NR*n+99)/100); v=a[r<1?1:r]
    if (unit == "us") printf "%d", v; else printf "%.1f", v/1000}'
}

# compat: nvhook's CUDA forward-compat choice for each compat directory on this host.
compat() {
  local runc="$KIT/bin/runc --root /run/nvhook-check" dir root seen=" " found=0
  local probe='["/gpucheck","--kernel","1024"]'
  local env='["NVIDIA_VISIBLE_DEVICES=0","NVIDIA_DRIVER_CAPABILITIES=compute,utility"]'
  config compat 'nvml-cache-file = ""'
  # shellcheck disable=SC2086 # the default is a list of globs
  for dir in ${COMPAT_DIRS:-/usr/local/cuda/compat /usr/local/cuda-*/compat}; do
    [ -d "$dir" ] || continue
    # /usr/local/cuda usually links to one of the /usr/local/cuda-X.Y: each directory once.
    case "$seen" in *" $(realpath "$dir") "*) continue ;; esac
    seen="$seen$(realpath "$dir") "
    found=1
    echo "== CUDA compat: $dir ($(ls "$dir" | grep -E '^libcuda\.so\.[0-9]+\.' | tr '\n' ' '))"
    root="$KIT/compat-rootfs"
    rm -rf "$root"
    cp -a "$KIT/rootfs" "$root"
    mkdir -p "$root/usr/local/cuda"
    cp -a "$dir" "$root/usr/local/cuda/compat"
    # A loader cache, as CUDA images have, for nvhook to point at the compat files.
    echo /lib/x86_64-linux-gnu > "$root/etc/ld.so.conf"
    ldconfig -r "$root"
    ROOTFS=$root bundle compat "$probe" "$env" "$KIT/compat.toml"
    "$KIT/bin/nvhook" --config "$KIT/compat.toml" plan --bundle "$KIT/b-compat" \
      | sed -n '/^CUDA compat/,/^[^ ]/p' | grep -E '^(CUDA compat|  )' || echo "no CUDA compat line in the plan"
    $runc run --bundle "$KIT/b-compat" compat | grep -E '^(dlopen|cuInit|kernel)' || true
  done
  [ "$found" = 1 ] || echo "== CUDA compat: no CUDA compat directory on this host"
}

# nested: a nested procfs mount in GPU containers, masked and unmasked, with and without the view.
nested() {
  local runc="$KIT/bin/runc --root /run/nvhook-check" view unmasked
  local probe='["/bin/sh","-c","echo gpus: $(busybox ls /proc/driver/nvidia/gpus); busybox unshare -Urpf --mount-proc true && echo nested procfs ok || echo nested procfs refused"]'
  local env='["NVIDIA_VISIBLE_DEVICES=0","NVIDIA_DRIVER_CAPABILITIES=utility"]'
  fresh_image
  for view in always auto; do
    config "nested-$view" "proc-driver-view = \"$view\""
    for unmasked in "" 1; do
      echo "== nested sandbox: proc-driver-view = $view, /proc ${unmasked:+un}masked"
      AS_USER=1000 UNMASKED=$unmasked bundle nested "$probe" "$env" "$KIT/nested-$view.toml"
      $runc run --bundle "$KIT/b-nested" nested 2>&1 || true
    done
  done
}

# memlimits: the driver's answer to a GPU memory limit, and a container held to one.
memlimits() {
  local runc="$KIT/bin/runc --root /run/nvhook-check" lib uuid dir rc
  echo "== GPU memory limits"
  fresh_image
  config limits ""
  "$KIT/bin/nvhook" --config "$KIT/limits.toml" info | grep -i 'memory limits' || true
  if [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]; then
    echo "memory limits: /sys/fs/cgroup is not cgroup v2 here: the driver's limits need it"
    return
  fi
  lib=$(ldconfig -p | awk '$1 == "libnvidia-ml.so.1" && /x86-64/ {print $NF; exit}')
  uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
  dir=/sys/fs/cgroup/nvhook-check-$$
  mkdir "$dir"
  rc=0
  "$KIT/bin/nvhook-nvml" "$lib" set-memory-limits "$dir" $((512 << 20)) $((1024 << 20)) "$uuid" || rc=$?
  echo
  "$KIT/bin/nvhook-nvml" "$lib" get-memory-limits "$dir" "$uuid" || true
  echo
  rmdir "$dir"
  [ "$rc" = 0 ] || { echo "memory limits: the driver did not set them (above); no container run"; return; }
  local env='["NVIDIA_VISIBLE_DEVICES=0","NVIDIA_DRIVER_CAPABILITIES=compute,utility"'
  for limit in 1024 ""; do
    echo "== a container ${limit:+with NVIDIA_GPU_MEMORY_LIMIT=$limit MiB}${limit:-without a limit}: 256 MiB, then 2 GiB"
    local vars=$env
    [ -z "$limit" ] || vars="$vars,\"NVIDIA_GPU_MEMORY_REQUEST=0\",\"NVIDIA_GPU_MEMORY_LIMIT=$limit\""
    bundle limits '["/gpucheck","--kernel","67108864","--kernel","536870912"]' "$vars]" "$KIT/limits.toml"
    $runc run --bundle "$KIT/b-limits" "limits-$$" 2>&1 | grep -E '^(kernel|nvhook)' || true
  done
  grep -h 'GPU memory limits' "$OUT/limits.log" | tail -2 || true
}

# cdi_bundle NAME ARGS_JSON SPEC [floor|floor-hook]: a bundle with the CDI spec's edits for GPU 0,
# applied as an engine applies them. floor: only the device nodes and env; floor-hook: those and a
# createRuntime hook that runs the host's /bin/true (what runc's running of any hook costs).
cdi_bundle() {
  bundle "$1" "$2" '[]'
  python3 - "$KIT/b-$1/config.json" "$3" "${4:-}" <<'PY'
import json, os, sys
out, spec_path, floor = sys.argv[1:]
oci, cdi = json.load(open(out)), json.load(open(spec_path))
edits = [cdi.get("containerEdits", {})]
edits += [d["containerEdits"] for d in cdi["devices"] if d["name"] == "0"]
linux = oci["linux"]
for e in edits:
    oci["process"]["env"] += e.get("env", [])
    for node in e.get("deviceNodes", []):
        rdev = os.stat(node.get("hostPath", node["path"])).st_rdev
        major, minor = os.major(rdev), os.minor(rdev)
        linux.setdefault("devices", []).append({"path": node["path"], "type": node.get("type", "c"),
            "major": major, "minor": minor, "fileMode": node.get("fileMode", 0o666), "uid": 0, "gid": 0})
        linux["resources"]["devices"].append({"allow": True, "type": node.get("type", "c"), "major": major,
            "minor": minor, "access": node.get("permissions", "rwm")})
    if floor:
        continue
    for m in e.get("mounts", []):
        oci["mounts"].append({"destination": m["containerPath"], "source": m["hostPath"],
            "type": m.get("type", "bind"), "options": m.get("options", [])})
    for h in e.get("hooks", []):
        entry = {k: h[k] for k in ("path", "args", "env", "timeout") if k in h}
        oci.setdefault("hooks", {}).setdefault(h["hookName"], []).append(entry)
if floor == "floor-hook":
    oci.setdefault("hooks", {})["createRuntime"] = [{"path": "/bin/true", "args": ["true"]}]
json.dump(oci, open(out, "w"))
PY
}

# steps_p50 LOG [ID-PATTERN]: the p50 of each step in the hook's step lines, and of their sum (ms);
# with a pattern, only the runs whose `hook finished` line (the line after the steps) names a
# container id that the pattern matches at its start.
steps_p50() {
  python3 - "$1" "${2:-}" <<'PY'
import re, statistics, sys
steps, pending = {}, None
for line in open(sys.argv[1]):
    if "steps:" in line:
        pending = [p.split("=") for p in line.split("steps:", 1)[1].split()]
        continue
    found = re.search(r"hook finished .*\bid=(\S+)", line)
    if pending is None or not found:
        continue
    if re.match(sys.argv[2], found.group(1)):
        for name, us in pending:
            steps.setdefault(name, []).append(int(us))
        steps.setdefault("sum", []).append(sum(int(us) for _, us in pending))
    pending = None
print(" ".join(f"{k}={statistics.median(v) / 1000:.2f}" for k, v in steps.items()))
PY
}

# cdi: nvhook's CDI spec for this node, a GPU container through it, and its start cost.
cdi() {
  local runc="$KIT/bin/runc --root /run/nvhook-check" spec=$OUT/nvidia.json i v
  local probe='["/gpucheck","--kernel","1048576","--dev","/dev/nvidia0","--dev","/dev/nvidiactl","--exec","/usr/bin/nvidia-smi"]'
  echo "== CDI: nvhook cdi generate, GPU 0's edits applied as an engine does, through runc"
  config cdi-spec ""
  config hook-all ""
  "$KIT/bin/nvhook" --config "$KIT/cdi-spec.toml" cdi generate --output "$spec"
  python3 - "$spec" <<'PY'
import json, sys
cdi = json.load(open(sys.argv[1]))
hooks = [h for e in [cdi["containerEdits"]] + [d["containerEdits"] for d in cdi["devices"]]
         for h in e.get("hooks", [])]
args = hooks[0]["args"] if hooks else []
in_spec = f"{len(args)}, {sum(len(a) + 1 for a in args)} bytes"
if "--args-file" in args:
    at = args.index("--args-file")
    args = args[:at] + open(args[at + 1]).read().splitlines() + args[at + 3:]
    in_spec += f" in the spec, {len(args)} with its argument file"
print(f"spec: {len(cdi['devices'])} devices, hooks {[h['hookName'] for h in hooks]}, "
      f"mounts {len(cdi['containerEdits'].get('mounts', []))}; the hook's arguments: {in_spec}, "
      f"one-entry binds {args.count('--bind-file')}, "
      f"grouped binds {sum(args[i] in ('--bind-files', '--bind-sockets', '--bind-dirs') for i in range(len(args)))}")
PY
  rm -rf "$KIT/image-cached"
  cp -a "$KIT/rootfs" "$KIT/image-cached"
  echo /lib/x86_64-linux-gnu > "$KIT/image-cached/etc/ld.so.conf"
  ldconfig -r "$KIT/image-cached"
  echo "-- an image without a loader cache"
  layer probe-cdi "$KIT/rootfs"
  ROOTFS=$KIT/layers/probe-cdi/root cdi_bundle probe-cdi "$probe" "$spec"
  $runc run --bundle "$KIT/b-probe-cdi" probe-cdi
  echo "-- an image with a loader cache"
  layer probe-cdi-cached "$KIT/image-cached"
  ROOTFS=$KIT/layers/probe-cdi-cached/root cdi_bundle probe-cdi-cached "$probe" "$spec"
  $runc run --bundle "$KIT/b-probe-cdi-cached" probe-cdi-cached
  local kinds="plain cdi-floor cdi-floor-hook cdi cdi-cached hook-all"
  ROOTFS=$KIT/layers/cdi/root cdi_bundle cdi '["/bin/true"]' "$spec"
  # OTHER_NVHOOK: another nvhook build, whose hook runs the same spec in the same loop, right
  # before or right after this build's in turns. The prestart hook is left out: the two builds
  # do not share their kept answers, so it would query NVML at every start. The other build
  # reads a copy of the config: a parsed config is kept for one program, so two builds on one
  # file would each parse it at every start.
  if [ -n "${OTHER_NVHOOK:-}" ]; then
    cp "$KIT/cdi-spec.toml" "$KIT/cdi-spec-other.toml"
    # Its arguments inline, as a build before the argument file reads them.
    python3 - "$spec" "$OTHER_NVHOOK" "$KIT" > "$OUT/nvidia-other.json" <<'PY'
import json, sys
spec, other, kit = sys.argv[1:]
cdi = json.load(open(spec))
for hook in cdi["containerEdits"].get("hooks", []):
    args = hook["args"]
    if "--args-file" in args:
        at = args.index("--args-file")
        args[at:at + 3] = open(args[at + 1]).read().splitlines()
    hook["args"] = [f"{kit}/cdi-spec-other.toml" if a == f"{kit}/cdi-spec.toml" else a for a in args]
    if hook["path"] == f"{kit}/bin/nvhook":
        hook["path"] = other
json.dump(cdi, sys.stdout)
PY
    ROOTFS=$KIT/layers/cdi-other/root cdi_bundle cdi-other '["/bin/true"]' "$OUT/nvidia-other.json"
    kinds="plain cdi-floor cdi-floor-hook cdi cdi-other cdi-cached"
  fi
  ROOTFS=$KIT/layers/cdi-cached/root cdi_bundle cdi-cached '["/bin/true"]' "$spec"
  ROOTFS=$KIT/layers/cdi-floor/root cdi_bundle cdi-floor '["/bin/true"]' "$spec" floor
  ROOTFS=$KIT/layers/cdi-floor-hook/root cdi_bundle cdi-floor-hook '["/bin/true"]' "$spec" floor-hook
  ROOTFS=$KIT/layers/plain/root bundle plain '["/bin/true"]' '[]'
  ROOTFS=$KIT/layers/hook-all/root bundle hook-all '["/bin/true"]' \
    '["NVIDIA_VISIBLE_DEVICES=0","NVIDIA_DRIVER_CAPABILITIES=all"]' "$KIT/hook-all.toml"
  : > "$OUT/cdi-starts.txt"
  local order
  for i in $(seq "${ROUNDS:-20}"); do
    order=$kinds
    if [ $((i % 2)) = 0 ]; then order=${kinds/cdi cdi-other/cdi-other cdi}; fi
    for v in $order; do
      if [ "$v" = cdi-cached ]; then layer "$v" "$KIT/image-cached"; else layer "$v" "$KIT/rootfs"; fi
      echo "$v $(us $runc run --bundle "$KIT/b-$v" "$v-$i")" >> "$OUT/cdi-starts.txt"
    done
  done
  drop_layers
  echo "== whole starts, ms over ${ROUNDS:-20} (runc run of /bin/true, GPU 0, every capability): p50 p95"
  for v in $kinds; do
    echo "$v $(awk -v v="$v" '$1 == v {print $2}' "$OUT/cdi-starts.txt" | pct 50)" \
      "$(awk -v v="$v" '$1 == v {print $2}' "$OUT/cdi-starts.txt" | pct 95)"
  done
  echo "== the hooks' steps, p50 ms"
  echo "cdi createRuntime: $(steps_p50 "$OUT/cdi-spec.log" 'cdi-[0-9]')"
  echo "cdi createRuntime, an image with a loader cache: $(steps_p50 "$OUT/cdi-spec.log" cdi-cached-)"
  if [ -n "${OTHER_NVHOOK:-}" ]; then
    echo "cdi createRuntime, $OTHER_NVHOOK: $(steps_p50 "$OUT/cdi-spec.log" cdi-other-)"
    echo "== this build against $OTHER_NVHOOK, the median of each round's difference, ms"
    paired "$OUT/cdi-starts.txt" "$OUT/cdi-spec.log"
  else
    echo "prestart, every capability: $(steps_p50 "$OUT/hook-all.log")"
  fi
}

# costs: the kernel's price of each part of a driver file's view in a new layer.
costs() {
  local dir=$KIT/costs
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "== the kernel's costs of a view's parts, µs (median of 200)"
  unshare -m --propagation private python3 - "$dir" <<'PY' | tee "$OUT/costs.txt"
import ctypes, os, subprocess, sys, time
base = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    rc = libc.syscall(nr, *args)
    if rc < 0:
        raise OSError(ctypes.get_errno(), f"system call {nr}")
    return rc
# x86_64 and aarch64 share these numbers: open_tree, move_mount, fsopen, fsconfig, fsmount,
# mount_setattr.
OPEN_TREE, MOVE_MOUNT, FSOPEN, FSCONFIG, FSMOUNT, MOUNT_SETATTR = 428, 429, 430, 431, 432, 442
class Attr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("set", "clr", "propagation", "userns")]
def clone(path):
    return call(OPEN_TREE, -100, path.encode(), 1 | os.O_CLOEXEC)
def attach(tree, at):
    fd = os.open(at, os.O_PATH)
    call(MOVE_MOUNT, tree, b"", fd, b"", 0x4 | 0x40)
    os.close(fd)
def seal(tree):
    call(MOUNT_SETATTR, tree, b"", 0x1000 | 0x8000, ctypes.byref(Attr(1 | 2 | 4, 0, 0, 0)), 32)
def tmpfs():
    ctx = call(FSOPEN, b"tmpfs", 1)
    call(FSCONFIG, ctx, 6, None, None, 0)
    mnt = call(FSMOUNT, ctx, 1, 0)
    os.close(ctx)
    return mnt
def create(path):
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
def median(work, n=200):
    took = []
    for i in range(n):
        start = time.perf_counter_ns()
        work(i)
        took.append(time.perf_counter_ns() - start)
    return f"{sorted(took)[n // 2] / 1000:.1f}"
for d in ("lower", "upper", "work", "root", "ext4"):
    os.mkdir(f"{base}/{d}")
for i in range(200):
    os.mkdir(f"{base}/lower/c{i}")
source = f"{base}/source"
open(source, "w").write("x")
subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                f"lowerdir={base}/lower,upperdir={base}/upper,workdir={base}/work", f"{base}/root"],
               check=True)
root = f"{base}/root"
print("overlay: copy-up of a lower directory (the first create in it)", median(lambda i: create(f"{root}/c{i}/f")))
print("overlay: create in a copied-up directory", median(lambda i: create(f"{root}/c{i}/g")))
for fs, d in (("overlay", f"{root}/new"), ("ext4", f"{base}/ext4")):
    os.makedirs(d, exist_ok=True)
    print(f"{fs}: mkdir", median(lambda i: os.mkdir(f"{d}/d{i}")))
    print(f"{fs}: create", median(lambda i: create(f"{d}/f{i}")))
    print(f"{fs}: symlink", median(lambda i: os.symlink("x", f"{d}/l{i}")))
d = f"{root}/new"
trees = []
print("open_tree clone of a file", median(lambda i: trees.append(clone(source))))
print("mount_setattr ro,nosuid,nodev", median(lambda i: seal(trees[i])))
print("move_mount onto a file in overlay", median(lambda i: attach(trees[i], f"{d}/f{i}")))
fresh = []
print("new tmpfs (fsopen to fsmount)", median(lambda i: fresh.append(tmpfs())))
print("move_mount of a tmpfs onto a directory in overlay", median(lambda i: attach(fresh[i], f"{d}/d{i}")))
t = f"{d}/d0"
print("tmpfs: create", median(lambda i: create(f"{t}/f{i}")))
print("tmpfs: mkdir", median(lambda i: os.mkdir(f"{t}/d{i}")))
print("tmpfs: symlink", median(lambda i: os.symlink("x", f"{t}/l{i}")))
trees = [clone(source) for _ in range(200)]
print("move_mount onto a file in a tmpfs", median(lambda i: attach(trees[i], f"{t}/f{i}")))
PY
  rm -rf "$dir"
}

run() {
  OUT=$1
  mkdir -p "$OUT"
  fresh_image
  export LD_LIBRARY_PATH=$KIT/bin
  local runc="$KIT/bin/runc --root /run/nvhook-check" probe env all
  nvidia-smi -L || true
  echo "== the driver's device nodes"
  grep -E 'nvidia|nvswitch|nvlink' /proc/devices || true
  ls -l /dev/nvidia* /dev/nvidia-caps /dev/nvidia-caps-imex-channels 2>/dev/null || true
  # The tree the fingerprint of NVML's kept answer lists on every start (the simulated node has
  # only the MIG-enabled GPUs' part of it).
  find /proc/driver/nvidia/capabilities -printf '%y %p\n' > "$OUT/capabilities.txt" 2>/dev/null || true
  echo "== /proc/driver/nvidia/capabilities: $(wc -l < "$OUT/capabilities.txt") entries, $(grep -c '^d' "$OUT/capabilities.txt") directories"
  config kept ""
  config every 'nvml-cache-file = ""'
  config loads 'device-program-pins = ""'
  config cdi 'runtime-mode = "cdi"'
  "$KIT/bin/nvhook" --config "$KIT/kept.toml" info > "$OUT/info.txt"
  probe='["/gpucheck","--kernel","1048576","--dev","/dev/nvidia0","--dev","/dev/nvidia1","--dev","/dev/nvidiactl","--exec","/usr/bin/nvidia-smi"]'
  all='["NVIDIA_VISIBLE_DEVICES=0","NVIDIA_DRIVER_CAPABILITIES=all"]'
  echo "== runc + prestart hook"
  bundle probe-hook "$probe" "$all" "$KIT/kept.toml"
  $runc run --bundle "$KIT/b-probe-hook" probe-hook
  for mode in kept cdi; do
    echo "== nvhook-runtime ($mode)"
    bundle "probe-$mode" "$probe" "$all"
    NVHOOK_CONFIG="$KIT/$mode.toml" "$KIT/bin/nvhook-runtime" --root /run/nvhook-check \
      run --bundle "$KIT/b-probe-$mode" "probe-$mode"
  done

  env='["NVIDIA_VISIBLE_DEVICES=0","NVIDIA_DRIVER_CAPABILITIES=compute,utility"]'
  local i mode rounds=${ROUNDS:-20}
  : > "$OUT/starts.txt"
  for i in $(seq "$rounds"); do
    ROOTFS=$KIT/layers/plain/root bundle plain '["/bin/true"]' '[]'
    layer plain "$KIT/rootfs"
    echo "runc $(us $runc run --bundle "$KIT/b-plain" "plain-$i")" >> "$OUT/starts.txt"
    for mode in kept every; do
      ROOTFS=$KIT/layers/hook-$mode/root bundle "hook-$mode" '["/bin/true"]' "$env" "$KIT/$mode.toml"
      layer "hook-$mode" "$KIT/rootfs"
      echo "hook-$mode $(us $runc run --bundle "$KIT/b-hook-$mode" "hook-$mode-$i")" >> "$OUT/starts.txt"
      ROOTFS=$KIT/layers/shim-$mode/root bundle "shim-$mode" '["/bin/true"]' "$env"
      layer "shim-$mode" "$KIT/rootfs"
      echo "shim-$mode $(NVHOOK_CONFIG="$KIT/$mode.toml" us "$KIT/bin/nvhook-runtime" \
        --root /run/nvhook-check run --bundle "$KIT/b-shim-$mode" "shim-$mode-$i")" >> "$OUT/starts.txt"
    done
    ROOTFS=$KIT/layers/hook-loads/root bundle hook-loads '["/bin/true"]' "$env" "$KIT/loads.toml"
    layer hook-loads "$KIT/rootfs"
    echo "hook-loads $(us $runc run --bundle "$KIT/b-hook-loads" "hook-loads-$i")" >> "$OUT/starts.txt"
  done
  drop_layers
  echo "== whole starts, p50 ms over $rounds (runc run of /bin/true, GPU 0, compute,utility)"
  for v in runc hook-kept hook-every hook-loads shim-kept shim-every; do
    echo "$v $(awk -v v="$v" '$1 == v {print $2}' "$OUT/starts.txt" | pct 50)"
  done
  echo "== the hook's inventory step, p50 ms"
  for mode in kept every; do
    echo "$mode $(grep -h 'steps:' "$OUT/$mode.log" | grep -o ' inventory=[0-9]*' | sed 's/.*=//' | pct 50)"
  done
  # The hooks alone: those after nvhook-runtime log to the same file, with no inventory step.
  echo "== what the hook alone reads and decides (kept NVML answer), each step's p50 µs"
  local step
  for step in process state request image inventory plan; do
    printf '%s=%s ' "$step" "$(grep -h 'steps:.* inventory=' "$OUT/kept.log" | grep -o " $step=[0-9]*" | sed 's/.*=//' | pct 50 us)"
  done
  echo
  # hook-loads: each container loads its own cgroup v2 device program (device-program-pins = "").
  echo "== the hook's cgroup step, p50 ms (programs kept in /sys/fs/bpf/nvhook: $(ls /sys/fs/bpf/nvhook 2>/dev/null | wc -l), on $(stat -f -c %T /sys/fs/bpf 2>/dev/null || echo 'no /sys/fs/bpf'))"
  for mode in kept loads; do
    echo "$mode $(grep -h 'steps:' "$OUT/$mode.log" | grep -o ' cgroup=[0-9]*' | sed 's/.*=//' | pct 50)"
  done
  cdi
  costs
  compat
  nested
  memlimits
}

case "${1:-}" in
  pack) pack "$(realpath -m "${2:?pack DIR}")" ;;
  run)
    KIT=$(cd "$(dirname "$0")" && pwd)
    trap finish EXIT
    run "$(realpath -m "${2:?run OUT}")"
    ;;
  compat | nested | memlimits | cdi | costs)
    KIT=$(cd "$(dirname "$0")" && pwd) OUT=$(realpath -m "${2:?$1 OUT}")
    mkdir -p "$OUT"
    export LD_LIBRARY_PATH=$KIT/bin
    trap finish EXIT
    "$1"
    ;;
  *) echo "usage: $0 pack DIR | run OUT | compat OUT | nested OUT | memlimits OUT | cdi OUT | costs OUT" >&2; exit 2 ;;
esac
