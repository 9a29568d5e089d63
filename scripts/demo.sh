#!/usr/bin/env bash
# The demo: build nvhook, make a simulated 4-GPU node, and run a real runc container
# that asks for GPUs 1 and 3 through the prestart hook. Needs root, runc, gcc, busybox-static.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "demo: run as root (it makes device nodes and runs runc)" >&2; exit 1; }
for tool in runc cc python3 /bin/busybox; do
  command -v "$tool" >/dev/null || { echo "demo: $tool is missing: apt-get install runc gcc python3 busybox-static" >&2; exit 1; }
done

cargo build --workspace --quiet
work=${NVHOOK_DEMO_DIR:-/tmp/nvhook-demo}
node="$work/node"
bundle="$work/bundle"
mkdir -p "$work"
runc delete -f nvhook-demo >/dev/null 2>&1 || true
rm -rf "$bundle"

echo "== simulated node =="
target/debug/simnode create "$node" --gpus 4

echo; echo "== nvhook info =="
target/debug/nvhook --config "$node/config.toml" info | head -20

mkdir -p "$bundle/rootfs/bin"
cp /bin/busybox "$bundle/rootfs/bin/busybox"
for applet in sh ls cat grep; do ln -s busybox "$bundle/rootfs/bin/$applet"; done
(cd "$bundle" && runc spec)
python3 - "$bundle/config.json" "$PWD/target/debug/nvhook" "$node/config.toml" <<'PY'
import json, sys
path, hook, config = sys.argv[1:]
spec = json.load(open(path))
spec["process"]["terminal"] = False
spec["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=1,3")
spec["process"]["args"] = ["sh", "-c",
    "echo '-- /dev:'; ls /dev | grep nvidia; "
    "echo '-- nvidia-smi:'; nvidia-smi; "
    "echo '-- driver libraries:'; ls /usr/lib | grep -c 550; "
    "echo '-- read-only mounts:'; grep nvidia /proc/self/mountinfo | grep -c ' ro,'"]
spec["hooks"] = {"prestart": [{"path": hook, "args": ["nvhook", "--config", config, "hook", "prestart"],
                               "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "timeout": 30}]}
json.dump(spec, open(path, "w"), indent=2)
PY

echo; echo "== nvhook plan (NVIDIA_VISIBLE_DEVICES=1,3) =="
target/debug/nvhook --config "$node/config.toml" plan --bundle "$bundle" | head -12

echo; echo "== runc run: what the container sees =="
(cd "$bundle" && runc run nvhook-demo)
runc delete -f nvhook-demo >/dev/null 2>&1 || true

echo; echo "== hook log ($node/nvhook.log) =="
grep "hook finished" "$node/nvhook.log" | tail -1
