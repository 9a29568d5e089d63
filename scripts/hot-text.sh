#!/usr/bin/env bash
# Writes link/hot-text.txt: the functions nvhook runs in a container start, and glibc's objects
# among them, which build.rs has the linker place together (docs/performance.md, twenty-fifth
# round). They are found on a simulated 8-GPU node, for three ways in: the prestart hook alone,
# nvhook-runtime's create with the hook after it, and the createRuntime hook of nvhook's CDI
# spec (a kubelet CDI request, a DRA claim, NRI's cdi mode). perf samples real starts, and
# callgrind adds the small functions sampling misses (it runs the create whole, and the hook
# until its first mount: valgrind does not know the mount API's calls). Run it when the hook's
# code has moved (tests/cli.rs checks that its main functions are still in the hot section).
# Needs root, perf (linux-perf), valgrind, runc, busybox-static, binutils; STARTS sets the
# sampled starts per way in.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require.sh
require_root hot-text "it runs runc containers"
require_rust hot-text
require_programs hot-text runc nm python3 valgrind perf /bin/busybox

starts=${STARTS:-1000}
cargo build --release --workspace
bin=$(realpath "${CARGO_TARGET_DIR:-target}/release")
work=$(mktemp -d "${TMPDIR:-/tmp}/nvhook-hot-text.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$bin/simnode" create "$work/node" --gpus 8 >/dev/null
config="$work/node/config.toml"
# At the packaged config's log level (the simulated node's is debug), with this build's hook.
sed -i -e 's/^log-level = .*/log-level = "info"/' -e "s|^hook-path = .*|hook-path = \"$bin/nvhook\"|" "$config"

mkdir -p "$work/bundle/rootfs/bin"
cp /bin/busybox "$work/bundle/rootfs/bin/busybox"
for applet in sh true; do ln -s busybox "$work/bundle/rootfs/bin/$applet"; done
(cd "$work/bundle" && runc spec)
python3 - "$work/bundle/config.json" "$bin/nvhook" "$config" <<'PY'
import json, sys
path, hook, config = sys.argv[1:]
spec = json.load(open(path))
spec["process"]["terminal"] = False
spec["process"]["args"] = ["true"]
spec["process"]["env"] += ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
json.dump(spec, open(path + ".plain", "w"))
spec["hooks"] = {"prestart": [{"path": hook, "args": ["nvhook", "--config", config, "hook", "prestart"]}]}
json.dump(spec, open(path + ".hook", "w"))
PY
# The CDI route: the spec's edits for device `all`, applied as an engine applies them.
"$bin/nvhook" --config "$config" cdi generate --format json > "$work/cdi.json"
python3 - "$work/bundle/config.json" "$work/cdi.json" <<'PY'
import json, sys
path, cdi = sys.argv[1:]
spec = json.load(open(path + ".plain"))
cdi = json.load(open(cdi))
device = next(d for d in cdi["devices"] if d["name"] == "all")
for edits in (cdi.get("containerEdits", {}), device["containerEdits"]):
    spec["process"]["env"] += edits.get("env", [])
    for node in edits.get("deviceNodes", []):
        spec["linux"].setdefault("devices", []).append({k: node[k] for k in ("path", "type", "major", "minor", "fileMode")})
        spec["linux"]["resources"]["devices"].append(
            {"allow": True, "type": node["type"], "major": node["major"], "minor": node["minor"], "access": "rwm"})
    for hook in edits.get("hooks", []):
        entry = {k: hook[k] for k in ("path", "args", "env") if k in hook}
        spec.setdefault("hooks", {}).setdefault(hook["hookName"], []).append(entry)
json.dump(spec, open(path + ".cdi", "w"))
PY
cp -a "$work/bundle/rootfs" "$work/rootfs.orig"

# Each start gets a fresh rootfs and config.json (nvhook-runtime rewrites it).
run() {
  local i
  for i in $(seq "$starts"); do
    rm -rf "$work/bundle/rootfs"
    cp -a "$work/rootfs.orig" "$work/bundle/rootfs"
    cp "$work/bundle/config.json.$1" "$work/bundle/config.json"
    (cd "$work/bundle" && $2 run "hot-text-$i" >/dev/null)
  done
}
echo "== sampling $starts starts each: the prestart hook alone, the CDI spec's createRuntime hook, nvhook-runtime =="
perf record -q -F 25000 -o "$work/perf.data" -- bash -c "
  set -e; $(declare -f run); work=$work; starts=$starts
  run hook runc
  run cdi runc
  export NVHOOK_CONFIG=$config
  run plain $bin/nvhook-runtime"

perf script -i "$work/perf.data" --no-demangle -F ip,sym,dso 2>/dev/null |
  awk -v dso="($bin/nvhook)" '$NF == dso && $2 != "[unknown]" { print $2 }' > "$work/symbols"

echo "== callgrind: one hook, one create =="
mkdir "$work/vg"
cp "$bin/nvhook-runtime" "$bin/nvhook-nvml" "$work/vg/"
# Written at the hook's exit, or before the create execs the runtime (callgrind's own dump is
# at exit, which an exec skips).
cat > "$work/vg/nvhook" <<SH
#!/bin/sh
exec valgrind -q --tool=callgrind --demangle=no --dump-before=execve \\
  --callgrind-out-file=$work/callgrind.%p "$bin/nvhook" "\$@"
SH
chmod +x "$work/vg/nvhook"
sed -i "s|$bin/nvhook\"|$work/vg/nvhook\"|" "$work/bundle/config.json.hook"
run_once() { starts=1 run "$@" 2>/dev/null || true; }
run_once hook runc
NVHOOK_CONFIG=$config run_once plain "$work/vg/nvhook-runtime"
cat "$work"/callgrind.* | sed -n "s/^c\?fn=([0-9]*) \([^']*\).*/\1/p" >> "$work/symbols"
sort -u -o "$work/symbols" "$work/symbols"
nm -A --defined-only "$(cc -print-file-name=libc.a)" 2>/dev/null |
  awk '$2 ~ /^[TtWi]$/ { split($1, at, ":"); print $3, at[2] }' > "$work/libc-symbols"

python3 - "$work/symbols" "$work/libc-symbols" "$starts" > link/hot-text.txt <<'PY'
import re, sys
symbols, libc_symbols, starts = sys.argv[1:]
members = {}
for line in open(libc_symbols):
    symbol, member = line.split()
    members.setdefault(symbol, member)
functions, objects = set(), set()
for symbol in open(symbols).read().split():
    # A legacy symbol's hash (`17h<16 hex digits>E`) changes with the build's features (a bench
    # build unifies the dev-dependencies'): matched by its path alone, every instance of it.
    legacy = re.fullmatch(r"(_ZN.*17h)[0-9a-f]{16}E", symbol)
    if legacy:
        functions.add(legacy.group(1) + "*")
    elif symbol.startswith("_R"):
        # std's (v0 symbols): a copy LLVM made local to the program has a number of this
        # build's (`.1926`), so it is matched by its name alone.
        local = re.fullmatch(r"(_R\w+)\.\d+", symbol)
        functions.add(local.group(1) + "*" if local else symbol)
    elif symbol in members:
        objects.add(members[symbol])
    elif symbol == "main":
        # nvhook's own C entry point (src/bin/nvhook/main.rs).
        functions.add(symbol)
print("# The functions a container start runs in nvhook, and glibc's objects it runs, which")
print("# build.rs has the linker place together. Written by scripts/hot-text.sh from")
print(f"# {starts} sampled starts each of the prestart hook alone, of the CDI spec's createRuntime")
print("# hook and of nvhook-runtime's route, and callgrind's run of the first and the last.")
for function in sorted(functions):
    print("function", function)
for member in sorted(objects):
    print("libc", member)
PY
echo "link/hot-text.txt: $(grep -c '^function' link/hot-text.txt) functions, $(grep -c '^libc' link/hot-text.txt) glibc objects"
