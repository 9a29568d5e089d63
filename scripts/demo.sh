#!/usr/bin/env bash
# The demo: build nvhook, make a simulated 4-GPU node, and run a real runc container
# that asks for GPUs 1 and 3 through the prestart hook. Needs root, Rust, runc, gcc, busybox-static.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require.sh

require_root demo "it makes device nodes and runs runc"
[ -n "${NVHOOK_DEMO_BUILT:-}" ] || require_rust demo
require_programs demo runc cc ld python3 /bin/busybox

# The test suite runs the demo with the binaries it built (a nested cargo would wait on its lock).
if [ -z "${NVHOOK_DEMO_BUILT:-}" ]; then
  echo "== building nvhook (cargo build --workspace: a few minutes the first time, seconds after) =="
  cargo build --workspace
  echo
fi
bin=${CARGO_TARGET_DIR:-target}/debug
work=${NVHOOK_DEMO_DIR:-/tmp/nvhook-demo}
node="$work/node"
bundle="$work/bundle"
mkdir -p "$work"
runc delete -f nvhook-demo >/dev/null 2>&1 || true
rm -rf "$bundle"

echo "== simulated node =="
"$bin/simnode" create "$node" --gpus 4

echo; echo "== nvhook info: the node's driver and GPUs (all of it: $bin/nvhook --config $node/config.toml info) =="
"$bin/nvhook" --config "$node/config.toml" info | awk '
  /^(NVRM|CUDA) version:/ { print }
  /^Device Index:/ { index_ = $3 }
  /^Model:/ { sub(/^Model: +/, ""); model = $0 }
  /^GPU UUID:/ { printf "GPU %s: %s (%s)\n", index_, model, $3 }'
version=$("$bin/nvhook" --config "$node/config.toml" info | awk '/^NVRM version:/ { print $3; exit }')

mkdir -p "$bundle/rootfs/bin"
cp /bin/busybox "$bundle/rootfs/bin/busybox"
for applet in sh ls cat grep; do ln -s busybox "$bundle/rootfs/bin/$applet"; done
(cd "$bundle" && runc spec)
python3 - "$bundle/config.json" "$(realpath "$bin/nvhook")" "$node/config.toml" "$version" "$node" <<'PY'
import json, sys
path, hook, config, version, node = sys.argv[1:]
spec = json.load(open(path))
spec["process"]["terminal"] = False
spec["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=1,3")
spec["process"]["args"] = ["sh", "-c",
    "echo '-- /dev:'; ls /dev | grep nvidia; "
    "echo '-- nvidia-smi:'; nvidia-smi; "
    f"echo '-- driver libraries in /usr/lib (files of driver {version}; their SONAME links beside them):'; "
    f"ls /usr/lib | grep -c '[.]so[.]{version}$'; "
    f"echo '-- files and sockets the hook bind-mounted read-only from the node (the log says mounts: N):'; "
    f"awk 'index($4, \"{node}/\") == 1 && $6 ~ /^ro,/' /proc/self/mountinfo | wc -l"]
spec["hooks"] = {"prestart": [{"path": hook, "args": ["nvhook", "--config", config, "hook", "prestart"],
                               "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "timeout": 30}]}
json.dump(spec, open(path, "w"), indent=2)
PY

echo; echo "== nvhook plan (NVIDIA_VISIBLE_DEVICES=1,3): the first mounts of the list =="
"$bin/nvhook" --config "$node/config.toml" plan --bundle "$bundle" | awk '
  /^Mounts/ { in_mounts = 1; print; next }
  in_mounts && /^  / { if (++mounts <= 3) print; next }
  in_mounts { if (mounts > 3) printf "  ... and %d more\n", mounts - 3; in_mounts = 0 }
  { print }
  END { if (in_mounts && mounts > 3) printf "  ... and %d more\n", mounts - 3 }'

echo; echo "== runc run: what the container sees =="
(cd "$bundle" && runc run nvhook-demo)
runc delete -f nvhook-demo >/dev/null 2>&1 || true

echo
echo "The node's GPUs 1 and 3 are /dev/nvidia1 and /dev/nvidia3 in the container (the nodes keep"
echo "the host's numbers); nvidia-smi and CUDA count a container's GPUs from 0, so there they are"
echo "GPU 0 and GPU 1: the UUIDs say which is which (nvhook info lists the node's)."

echo; echo "== hook log ($node/nvhook.log) =="
grep "hook finished" "$node/nvhook.log" | tail -1

echo; echo "The simulated node and the bundle are files under $work: rm -rf $work removes them."
