#!/usr/bin/env bash
# Measures the prestart hook's own duration (its `total_us` log field) as runc runs it,
# on simulated nodes of 1 and 8 GPUs, all GPUs requested, with release binaries.
# Usage: sudo scripts/hook-timing.sh [RUNS]   (default 30 runs per node size)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-30}
cargo build --release --workspace --quiet
rel=$PWD/target/release
# The rootfs lives on tmpfs by default: on this machine's disk one file creation costs
# ~0.8 ms, which would hide the hook's own cost. NVHOOK_TIMING_TMP=/tmp measures on disk.
work=$(mktemp -d "${NVHOOK_TIMING_TMP:-/dev/shm}/nvhook-timing.XXXXXX")
trap 'rm -rf "$work/bundle"; for n in "$work"/node*; do "$rel/simnode" destroy "$n" >/dev/null 2>&1 || true; done; rm -rf "$work"' EXIT

mkdir -p "$work/bundle/rootfs/bin"
cp /bin/busybox "$work/bundle/rootfs/bin/busybox"
ln -s busybox "$work/bundle/rootfs/bin/true"
(cd "$work/bundle" && runc spec)
cp "$work/bundle/config.json" "$work/spec.template.json"
cp -a "$work/bundle/rootfs" "$work/rootfs.template"

for gpus in 1 8; do
  node="$work/node$gpus"
  "$rel/simnode" create "$node" --gpus "$gpus" --mock-nvml "$rel/libmock_nvml.so" --hook-path "$rel/nvhook" >/dev/null
  sed -i 's/^log-level = .*/log-level = "info"/' "$node/config.toml"
  for i in $(seq "$runs"); do
    rm -rf "$work/bundle/rootfs"; cp -a "$work/rootfs.template" "$work/bundle/rootfs"
    python3 - "$work/spec.template.json" "$work/bundle/config.json" "$rel/nvhook" "$node/config.toml" <<'PY'
import json, sys
src, dst, hook, config = sys.argv[1:]
spec = json.load(open(src))
spec["process"].update(terminal=False, args=["/bin/true"])
spec["process"]["env"] += ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"]
spec["hooks"] = {"prestart": [{"path": hook, "args": ["nvhook", "--config", config, "hook", "prestart"],
                               "env": ["PATH=/usr/bin"], "timeout": 30}]}
json.dump(spec, open(dst, "w"))
PY
    (cd "$work/bundle" && runc run "nvhook-timing-$gpus-$i" >/dev/null)
    runc delete -f "nvhook-timing-$gpus-$i" >/dev/null 2>&1 || true
  done
  python3 - "$node/nvhook.log" "$gpus" <<'PY'
import re, statistics, sys
log, gpus = sys.argv[1:]
t = sorted(int(m.group(1)) for m in re.finditer(r"hook finished.*total_us=(\d+)", open(log).read()))
p95 = t[min(len(t) - 1, int(len(t) * 0.95))]
print(f"{gpus} GPU(s), all capabilities: hook total p50 {statistics.median(t)/1000:.2f} ms, p95 {p95/1000:.2f} ms over {len(t)} starts")
PY
done
