#!/bin/sh
# nvhook node installer, run by the DaemonSet in nvhook-installer.yaml (image: Containerfile).
# Copies nvhook, nvhook-runtime and nvhook-nvml onto the host, sets nvhook's Kubernetes policy, registers
# runtime handler "nvidia" with containerd (nvhook configure containerd --kubernetes), and
# restarts containerd when its config changed. Safe to run again: an unchanged node is left
# alone, containerd included.
#
# Host paths are seen under $HOST_ROOT (the DaemonSet mounts the host's root there):
#   $NVHOOK_DIR/bin             the binaries           (default /usr/local/nvhook), and
#                               NVIDIA's command names as links to nvhook
#   $CONTAINERD_CONFIG          containerd's config    (default /etc/containerd/config.toml)
#   /etc/nvhook/config.toml     nvhook's config: where nvhook-runtime looks, containerd
#                               passing it no NVHOOK_CONFIG
# $RESTART_CONTAINERD is run with sh -c on a change (default: systemctl on the host, entered
# through PID 1, which needs hostPID).
#
# NVHOOK_MODE=nri (nvhook-installer-nri.yaml): NRI plugin mode. Steps 1 and 2 as above, then
# only nvhook's Kubernetes policy: containerd's config is neither edited nor restarted, and no
# runtime handler or RuntimeClass is made. The DaemonSet's long-running container then runs
# `nvhook nri`, which connects to containerd's NRI socket. containerd 2 runs NRI by default; a
# containerd 1.7 whose NRI is off stops the install here with the one-time fix.
set -eu

host=${HOST_ROOT:-/host}
source_dir=${NVHOOK_SOURCE:-/opt/nvhook/bin}
nvhook_dir=${NVHOOK_DIR:-/usr/local/nvhook}
containerd_config=${CONTAINERD_CONFIG:-/etc/containerd/config.toml}
restart=${RESTART_CONTAINERD:-nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart containerd}
nvhook_config=/etc/nvhook/config.toml
mode=${NVHOOK_MODE:-runtime}
case $mode in
    runtime | nri) ;;
    *)
        echo "nvhook-install: NVHOOK_MODE=$mode: expected runtime or nri" >&2
        exit 2
        ;;
esac

say() { echo "nvhook-install: $*"; }

# 1. The binaries, each replaced by a rename: a container starting meanwhile runs the old
#    file or the new one, never half of one.
mkdir -p "$host$nvhook_dir/bin"
for name in nvhook nvhook-runtime nvhook-nvml; do
    new="$host$nvhook_dir/bin/.$name.new"
    cp "$source_dir/$name" "$new"
    chmod 0755 "$new"
    mv -f "$new" "$host$nvhook_dir/bin/$name"
done
say "installed nvhook, nvhook-runtime and nvhook-nvml in $nvhook_dir/bin"
# NVIDIA's command names beside nvhook, which answers to them: for CDI specs written by NVIDIA's
# tools (point the device plugin's --nvidia-cdi-hook-path here) and engines' --gpus (put this
# directory on the engine's PATH). Links, so they follow each new nvhook.
for name in nvidia-container-runtime-hook nvidia-container-cli nvidia-cdi-hook; do
    ln -sfn nvhook "$host$nvhook_dir/bin/$name"
done

# 2. nvhook-runtime writes hook-path into every GPU container's hooks: it must name the
#    nvhook installed above. An admin's own hook-path is kept.
hook_path="$nvhook_dir/bin/nvhook"
if [ ! -e "$host$nvhook_config" ]; then
    mkdir -p "$(dirname "$host$nvhook_config")"
    printf '# Written by the nvhook node installer; every key: nvhook config/config.toml.\nhook-path = "%s"\n' \
        "$hook_path" >"$host$nvhook_config"
elif ! grep -q '^[[:space:]]*hook-path[[:space:]]*=' "$host$nvhook_config"; then
    # The file's keys are all top-level, so an appended key is one of them.
    [ -z "$(tail -c 1 "$host$nvhook_config")" ] || echo >>"$host$nvhook_config"
    printf 'hook-path = "%s"\n' "$hook_path" >>"$host$nvhook_config"
elif ! grep -q "^[[:space:]]*hook-path[[:space:]]*=[[:space:]]*\"$hook_path\"" "$host$nvhook_config"; then
    say "warning: $nvhook_config sets its own hook-path; GPU containers run that nvhook, not $hook_path"
fi

# 3 (NRI mode). NRI must be on already: turning it on in containerd 1.7 takes a restart,
#    which this mode never does. Then the policy alone: with NRI on, configure --nri leaves
#    containerd's config as it is.
if [ "$mode" = nri ]; then
    if chroot "$host" "$nvhook_dir/bin/nvhook" configure containerd --nri --dry-run \
        --engine-config "$containerd_config" | grep -q '^dry run: '; then
        say "containerd's NRI is off in $containerd_config (containerd 1.7 ships it off): turn it on once on the node (nvhook configure containerd --nri, then systemctl restart containerd), or use nvhook-installer.yaml (runtime mode)" >&2
        exit 1
    fi
    chroot "$host" "$nvhook_dir/bin/nvhook" --config "$nvhook_config" \
        configure containerd --nri --kubernetes \
        --engine-config "$containerd_config" | grep -v '^then start '
    say "NRI mode: containerd's config unchanged, no restart; this DaemonSet's nri container runs the plugin"
    exit 0
fi

# 3. Policy and runtime handler, by the nvhook just installed, run in the host's root (it is
#    static): every path it reads or writes, including the drop-in directory a containerd 2
#    config imports (/etc/containerd/conf.d), is then the host's own.
said=$(chroot "$host" "$nvhook_dir/bin/nvhook" --config "$nvhook_config" \
    configure containerd --kubernetes \
    --engine-config "$containerd_config" \
    --runtime-path "$nvhook_dir/bin/nvhook-runtime")
echo "$said"

# 4. containerd reads its config only at start, and nvhook says when it wrote any of it.
#    Running containers keep running: their runc shims do not depend on the daemon.
if echo "$said" | grep -q '^to apply it: '; then
    say "restarting containerd: $restart"
    sh -c "$restart"
else
    say "containerd's config unchanged: no restart"
fi
