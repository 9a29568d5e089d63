#!/bin/sh
# nvhook node uninstaller: undoes on this node what install.sh and refresh.sh did, in runtime
# mode (nvhook-installer.yaml) and in NRI mode (nvhook-installer-nri.yaml) alike. Delete the
# DaemonSet first, so that nothing installs or refreshes again, and in runtime mode the pods of
# `runtimeClassName: nvidia` on the node too: their shims call nvhook-runtime to stop them.
#
# Run it from the installer image, with the host's root at /host and its PIDs (for the restart):
#   kubectl debug node/NODE -it --profile=sysadmin --image=IMAGE -- /opt/nvhook/uninstall.sh
# or on the node itself, as root: HOST_ROOT=/ sh deploy/kubernetes/uninstall.sh
#
# 1. containerd: the installed nvhook takes its runtime handler out (nvhook configure
#    containerd --remove: the config as it was before install.sh, or nvhook's drop-in moved
#    aside) and containerd is restarted when that changed anything, as install.sh restarts it.
#    NRI mode wrote no handler: nothing changes and nothing restarts. The backups those edits
#    leave (*.nvhook.bak) are deleted: they hold the configured version.
# 2. What refresh.sh keeps: the CDI specs nvhook wrote (/var/run/cdi/nvidia.yaml and the
#    nvidia-<class>.yaml beside it, each only if it names nvhook), NVML's cached answer (the
#    config's nvml-cache-file, its .lock and the hooks' argument files beside it), the NFD
#    feature file (/etc/kubernetes/node-feature-discovery/features.d/nvhook) and the /dev/char links of the
#    NVIDIA nodes (<dev-root>/dev/char/MAJ:MIN -> ../nvidia*).
# 3. /etc/nvhook/config.toml: deleted with its backup when it holds only what install.sh wrote;
#    an admin's own file loses only the hook-path line naming the nvhook removed here, and keeps
#    its other keys, the Kubernetes policy and the backup (loosening it is the admin's call).
# 4. The binaries and NVIDIA's command names in $NVHOOK_DIR/bin, then $NVHOOK_DIR/bin and
#    $NVHOOK_DIR when empty, and nvhook's state directory /run/nvhook (the NRI plugin's
#    gathered driver directories unmounted first; its hooks' argument files with it).
# Directories other programs use too (/var/run/cdi, /etc/containerd/conf.d, NFD's features.d,
# /dev/char) stay, and so does a log-file the admin configured. Safe to run again: a node
# without nvhook is left as it is.
#
#   $HOST_ROOT            the host's / (default /host)
#   $NVHOOK_DIR           where install.sh put the binaries (default /usr/local/nvhook)
#   $CONTAINERD_CONFIG    containerd's config (default /etc/containerd/config.toml)
#   $RESTART_CONTAINERD   run with sh -c after a change (default: systemctl on the host,
#                         entered through PID 1, which needs the host's PIDs)
set -eu

host=${HOST_ROOT:-/host}
nvhook_dir=${NVHOOK_DIR:-/usr/local/nvhook}
containerd_config=${CONTAINERD_CONFIG:-/etc/containerd/config.toml}
restart=${RESTART_CONTAINERD:-nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart containerd}
nvhook_config=/etc/nvhook/config.toml
nvhook=$nvhook_dir/bin/nvhook
installer_header='# Written by the nvhook node installer'

say() { echo "nvhook-uninstall: $*"; }
[ -e "$host$nvhook" ] || say "no nvhook in $nvhook_dir/bin: removing only what is left of it"

# A string key of nvhook's config, or $2 where the config does not set it.
config_key() {
    value=
    [ ! -f "$host$nvhook_config" ] ||
        value=$(sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*[\"']\([^\"']*\)[\"'].*/\1/p" \
            "$host$nvhook_config" | tail -n 1)
    echo "${value:-$2}"
}

# 1. The runtime handler, removed by the nvhook that wrote it, in the host's root.
if [ -x "$host$nvhook" ]; then
    said=$(chroot "$host" "$nvhook" configure containerd --remove \
        --engine-config "$containerd_config")
    echo "$said"
    for backup in $(echo "$said" | grep -o '/[^ ()]*\.nvhook\.bak' || true); do
        rm -f "$host$backup"
    done
    if echo "$said" | grep -q '^to apply it: '; then
        say "restarting containerd: $restart"
        sh -c "$restart"
    else
        say "containerd's config unchanged: no restart"
    fi
elif grep -rqs "$nvhook_dir/bin/nvhook-runtime" "$host$containerd_config" \
    "$host$(dirname "$containerd_config")/conf.d"; then
    say "$containerd_config still names $nvhook_dir/bin/nvhook-runtime, but $nvhook is gone: take runtime \"nvidia\" out by hand and restart containerd" >&2
    exit 1
fi

# A host path as seen here, under $host. The host's /var/run is mostly a link to /run, an
# absolute one that would lead out of $host: its target is taken under $host.
on_host() {
    case $1 in
        /var/run/*)
            target=$(readlink "$host/var/run" || true)
            case $target in
                /*) echo "$host$target/${1#/var/run/}" && return ;;
            esac
            ;;
    esac
    echo "$host$1"
}

# 2. What refresh.sh wrote: the CDI specs, NVML's cache, the node's labels, the /dev/char links.
cdi_dir=$(on_host /var/run/cdi/)
for spec in "${cdi_dir}nvidia.yaml" "$cdi_dir"nvidia-*.yaml; do
    if [ -f "$spec" ] && grep -q nvhook "$spec"; then
        rm -f "$spec"
        say "removed /var/run/cdi/${spec#"$cdi_dir"}"
    fi
done
# The files that held the spec's hook arguments beside it (`.nvidia.yaml.SUM.args`).
for args in "$cdi_dir".nvidia.yaml.*.args; do
    if [ -f "$args" ]; then
        rm -f "$args"
        say "removed /var/run/cdi/${args#"$cdi_dir"}"
    fi
done
cache=$(on_host "$(config_key nvml-cache-file /run/nvhook/nvml-inventory.json)")
for file in "$cache" "$cache.lock"; do
    [ ! -f "$file" ] || rm -f "$file"
done
# The hooks' argument files kept beside it (nvhook's own directory, where the cache is not in
# /run/nvhook, which goes whole below).
[ ! -d "$cache" ] && [ -d "$(dirname "$cache")/hook-args" ] && rm -rf "$(dirname "$cache")/hook-args"
rm -f "$host/etc/kubernetes/node-feature-discovery/features.d/nvhook"
char_dir=$host$(config_key dev-root /)/dev/char
links=0
for link in "$char_dir"/*; do
    [ -L "$link" ] || continue
    case $(readlink "$link") in
        ../nvidia*)
            rm -f "$link"
            links=$((links + 1))
            ;;
    esac
done
[ "$links" -eq 0 ] || say "removed $links /dev/char links of NVIDIA nodes"

# 3. nvhook's config: install.sh's own file, or only install.sh's line in an admin's file.
config=$host$nvhook_config
hook_line="^[[:space:]]*hook-path[[:space:]]*=[[:space:]]*\"$nvhook\"[[:space:]]*\$"
if [ -f "$config" ]; then
    others=$(grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' -e "$hook_line" \
        -e '^accept-env-when-unprivileged = false$' -e '^accept-volume-mount-devices = true$' \
        "$config" || true)
    if head -n 1 "$config" | grep -qF "$installer_header" && [ -z "$others" ]; then
        rm -f "$config" "$config.nvhook.bak"
        rmdir "$(dirname "$config")" 2>/dev/null || true
        say "removed $nvhook_config"
    elif grep -q "$hook_line" "$config"; then
        sed -i "\\|$hook_line|d" "$config"
        say "kept $nvhook_config (keys of its own) without its hook-path; its Kubernetes policy stays"
    fi
fi

# 4. The binaries, the names linked to them, an interrupted install's leftovers, the state.
for name in nvhook nvhook-runtime nvhook-nvml \
    nvidia-container-runtime-hook nvidia-container-cli nvidia-cdi-hook; do
    rm -f "$host$nvhook_dir/bin/$name" "$host$nvhook_dir/bin/.$name.new"
done
rmdir "$host$nvhook_dir/bin" 2>/dev/null || true
rmdir "$host$nvhook_dir" 2>/dev/null || true
# The driver files gathered beside NVML's cache: the trees the CDI hook keeps for the next
# containers (hook-trees), and the directories an NRI plugin gathered (driver-dirs) if it was
# killed before it could unmount them. The host's mount (its namespace entered through PID 1,
# where $host is PID 1's root), then this container's own copy of it where it has one; rm
# cannot remove a mount point. Running containers keep their own copies.
host_is_pid1s_root=false
[ "$(stat -L -c %d:%i "$host/" 2>/dev/null)" != "$(stat -L -c %d:%i /proc/1/root/ 2>/dev/null)" ] ||
    host_is_pid1s_root=true
for gathered in "$host/run/nvhook/driver-dirs" "$(dirname "$cache")/driver-dirs" \
    "$host/run/nvhook/hook-trees" "$(dirname "$cache")/hook-trees"; do
    mountpoint -q "$gathered" 2>/dev/null || continue
    if $host_is_pid1s_root; then
        nsenter --target 1 --mount -- umount --lazy "${gathered#"$host"}" 2>/dev/null || true
    fi
    umount --lazy "$gathered" 2>/dev/null || true
    say "unmounted the driver files nvhook gathered (${gathered#"$host"})"
done
rm -rf "$host/run/nvhook"
say "done: nvhook is off this node"
