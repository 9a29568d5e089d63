#!/usr/bin/env bash
# Regenerates tests/fixtures/nvidia-hook-containers/<image>.txt: what a container started
# through NVIDIA's CDI spec (tests/fixtures/nvidia-ctk/nvml-index.yaml, device
# nvidia.com/gpu=1) gets from NVIDIA's own nvidia-cdi-hook, through Podman and runc, on a
# simulated node. tests/nvidia_hook_containers.rs runs the same containers with nvhook as
# nvidia-cdi-hook and compares.
#
# Usage: scripts/nvidia-hook-containers.sh NVIDIA_HOOK
#   NVIDIA_HOOK: NVIDIA's nvidia-cdi-hook (the fixtures were made with v1.20.0, commit
#   5505e2f94d9aaa08561490db974ba3cd676af209: .engines/nvctk/bin/nvidia-cdi-hook, see
#   .engines/nvctk/build-hooks.sh).
#
# The images are the tests' own (tests/support's build_glibc_image, built by the ignored test
# build_images_for_the_fixture_script in tests/nvidia_hook_containers.rs, with busybox added):
# the plain glibc image; two with CUDA forward-compat libraries (libcuda 580.95.05, newer than
# the node's driver 550.54.15, and 535.104.05, older); and the 580.95.05 one again with an
# /etc/ld.so.conf that reads /etc/ld.so.conf.d (the tests' image lists its library directory
# alone, so ldconfig reads no file there). In each container
# tests/fixtures/nvidia-hook-containers/list.sh prints the loader cache in hex, stat of the
# NVIDIA-related paths, the lines of the ld.so.conf{,.d} and /etc/nvidia files, and /gpucheck's
# output. The cache is decoded here with `ldconfig -p -C`, which keeps its order. The node's
# path becomes @NODE@; the random names NVIDIA's hook gives files (uuids, os.CreateTemp digits)
# become @UUID@ and @N@.
#
# Podman runs with private storage, run root, hooks and networks (as tests/support's Podman),
# in a cgroup parent of its own; the spec goes to /var/run/cdi under a unique name. All of it
# is removed on exit. Needs root, cargo, podman, runc, busybox (static), ldconfig, xxd.
# Any failure stops it with one line that names the cause.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "nvidia-hook-containers: $*" >&2
  exit 1
}

[ $# -eq 1 ] || fail "usage: $0 NVIDIA_HOOK (NVIDIA's nvidia-cdi-hook, e.g. .engines/nvctk/bin/nvidia-cdi-hook)"
HOOK=$(realpath -e "$1" 2>/dev/null) || fail "$1 does not exist"
[ -f "$HOOK" ] && [ -x "$HOOK" ] || fail "$HOOK is not an executable file"
hook_said=$("$HOOK" --version 2>&1 | head -1) || fail "$HOOK --version failed: $hook_said"
case "$hook_said" in
"NVIDIA CDI Hook version "*) ;;
*) fail "$HOOK is not NVIDIA's nvidia-cdi-hook (--version said: $hook_said)" ;;
esac
[ "$(id -u)" -eq 0 ] || fail "run as root: simnode makes device nodes, podman runs containers"
for program in cargo podman runc busybox ldconfig xxd tar realpath; do
  command -v $program >/dev/null || fail "$program is missing"
done

OUT=$PWD/tests/fixtures/nvidia-hook-containers
SPEC=$PWD/tests/fixtures/nvidia-ctk/nvml-index.yaml
DEVICE=nvidia.com/gpu=1
[ -f "$OUT/list.sh" ] || fail "$OUT/list.sh is missing"
[ -f "$SPEC" ] || fail "$SPEC is missing"
started=$(date +%s)

WORK=$(mktemp -d /tmp/nvidia-hook-containers.XXXXXX)
NODE=$WORK/node
CDI=/var/run/cdi/nvidia-hook-containers-$$.yaml
CGROUP=nvidia-hook-containers-$$
PODMAN_DIR=$WORK/podman
mkdir -p "$PODMAN_DIR/hooks.d" "$PODMAN_DIR/networks"
podman_() {
  podman --root "$PODMAN_DIR/root" --runroot "$PODMAN_DIR/runroot" --tmpdir "$PODMAN_DIR/tmp" \
    --volumepath "$PODMAN_DIR/volumes" --hooks-dir "$PODMAN_DIR/hooks.d" \
    --network-config-dir "$PODMAN_DIR/networks" --cgroup-manager cgroupfs \
    --events-backend file --runtime runc "$@"
}
cleanup() {
  podman_ rm -af >/dev/null 2>&1 || true
  podman_ system reset -f >/dev/null 2>&1 || true
  rm -f "$CDI"
  rmdir /var/run/cdi 2>/dev/null || true
  for cg in /sys/fs/cgroup/$CGROUP /sys/fs/cgroup/*/$CGROUP; do
    if [ -d "$cg" ]; then find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
  target/debug/simnode destroy "$NODE" >/dev/null 2>&1 || true
  # Whatever is still mounted below the work directory (Podman's storage), deepest first.
  awk -v w="$WORK" '$5 == w || index($5, w "/") == 1 { print $5 }' /proc/self/mountinfo |
    sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# --- the simulated node and the images -------------------------------------------------------
cargo build -q -p simnode -p mock-nvml >"$WORK/cargo.log" 2>&1 ||
  fail "cargo build -p simnode -p mock-nvml failed: $(grep -m1 '^error' "$WORK/cargo.log" || tail -1 "$WORK/cargo.log")"
target/debug/simnode create "$NODE" --gpus 4 --hook-path "$HOOK" >"$WORK/simnode.log" 2>&1 ||
  fail "simnode create $NODE --gpus 4 failed: $(tail -1 "$WORK/simnode.log")"
[ -f "$NODE/driver/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" ] ||
  fail "the node's driver is not 550.54.15, the version the nvidia-ctk fixtures were generated for"
NVHOOK_HOOK_CONTAINERS_IMAGES=$WORK/images cargo test -q --test nvidia_hook_containers -- \
  --ignored --exact build_images_for_the_fixture_script >"$WORK/images.log" 2>&1 ||
  fail "building the images (cargo test --test nvidia_hook_containers build_images_for_the_fixture_script) failed: $(grep -m1 -E "^error|panicked" "$WORK/images.log" || tail -1 "$WORK/images.log")"

# --- NVIDIA's spec ---------------------------------------------------------------------------
mkdir -p /var/run/cdi
sed -e "s#@NODE@#$NODE#g" -e "s#@HOOK@#$HOOK#g" "$SPEC" >"$CDI"
! grep -q '@[A-Z]*@' "$CDI" || fail "$CDI still has a placeholder: $(grep -m1 '@[A-Z]*@' "$CDI")"

# --- the containers --------------------------------------------------------------------------
list=$(cat "$OUT/list.sh")
# section NAME: the lines of $WORK/$name.out after `== NAME`, up to the next marker.
section() { awk -v m="== $1" '$0 == m { on = 1; next } /^== / { on = 0 } on' "$WORK/$name.out"; }
uuid='[0-9a-f]\{8\}-[0-9a-f]\{4\}-[0-9a-f]\{4\}-[0-9a-f]\{4\}-[0-9a-f]\{12\}'
made=()
for image_dir in "$WORK"/images/*/; do
  name=$(basename "$image_dir")
  tar --numeric-owner -C "$image_dir/rootfs" -cf "$WORK/$name.tar" . ||
    fail "tar of the $name image failed"
  podman_ import "$WORK/$name.tar" "localhost/nvidia-hook-containers-$name:latest" >"$WORK/$name.import.log" 2>&1 ||
    fail "podman import of the $name image failed: $(tail -1 "$WORK/$name.import.log")"
  podman_ run --rm --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 --network none \
    --cgroup-parent "/$CGROUP" --device "$DEVICE" "localhost/nvidia-hook-containers-$name:latest" \
    /usr/bin/busybox sh -c "$list" >"$WORK/$name.out" 2>"$WORK/$name.err" ||
    fail "podman run of the $name image through NVIDIA's spec failed: $(grep -m1 -iE 'error|fail' "$WORK/$name.err" || tail -1 "$WORK/$name.err")"
  section cache | xxd -r -p >"$WORK/$name.cache"
  [ -s "$WORK/$name.cache" ] || fail "the $name container printed no loader cache"
  {
    echo "== cache"
    ldconfig -p -C "$WORK/$name.cache" | sed -n 's/^\t//p'
    echo "== tree"
    section tree | sed -e "s#$uuid#@UUID@#g" -e 's#\([0z][0z]-nvcr-\)[0-9]*\.conf#\1@N@.conf#g' | LC_ALL=C sort
    echo "== files"
    section files | sed -e "s#$uuid#@UUID@#g" -e 's#\([0z][0z]-nvcr-\)[0-9]*\.conf#\1@N@.conf#g'
    echo "== gpucheck"
    section gpucheck
  } | sed -e "s#$NODE#@NODE@#g" >"$WORK/$name.txt"
  ! grep -q "$WORK" "$WORK/$name.txt" || fail "$name.txt still names $WORK"
  grep -q '^libcuda.so.1 ' "$WORK/$name.txt" || fail "the $name container's cache has no libcuda.so.1"
  made+=("$name")
done
[ ${#made[@]} -eq 4 ] || fail "expected 4 images, built ${#made[@]}: ${made[*]}"
for name in "${made[@]}"; do
  cp "$WORK/$name.txt" "$OUT/$name.txt"
done
echo "nvidia-hook-containers: $hook_said ($("$HOOK" --version 2>&1 | sed -n 's/^commit: //p')): wrote $OUT/{$(
  IFS=,
  echo "${made[*]}"
)}.txt in $(($(date +%s) - started))s"
