#!/bin/sh
# nvhook node upkeep, the long-running container of nvhook-installer.yaml (after install.sh):
# keeps this node's CDI spec (/var/run/cdi/nvidia.yaml) true to its GPUs, driver and MIG
# layout, the /dev/char links of its NVIDIA nodes in place, and its GPU labels (GPU feature
# discovery's names) in Node Feature Discovery's feature file
# (/etc/kubernetes/node-feature-discovery/features.d/nvhook), at start and then every
# $REFRESH_INTERVAL_S seconds (default 300; 0: once, then exit); after the first round it
# prints `nvhook doctor`'s report. Each step runs the nvhook
# install.sh put on the host, inside the host's root, so every path is the host's own; a step
# that fails is reported and tried again next time, never the end of the loop.
#
#   $HOST_ROOT     the host's / (default /host)
#   $NVHOOK_DIR    where install.sh put the binaries (default /usr/local/nvhook)
#   $MIG_STRATEGY  the device plugin's MIG strategy, for the labels: none, single or mixed
#                  (default none)
#   $NVHOOK_MODE   nri in nvhook-installer-nri.yaml: doctor checks the node as an NRI plugin
#                  node (`nvhook doctor --nri`)
set -eu

host=${HOST_ROOT:-/host}
nvhook=${NVHOOK_DIR:-/usr/local/nvhook}/bin/nvhook
interval=${REFRESH_INTERVAL_S:-300}
nfd_file=/etc/kubernetes/node-feature-discovery/features.d/nvhook
mig_strategy=${MIG_STRATEGY:-none}

say() { echo "nvhook-refresh: $*"; }

refresh() {
    chroot "$host" "$nvhook" cdi refresh || say "warning: cdi refresh failed; next try in ${interval}s"
    chroot "$host" "$nvhook" dev-char-links >/dev/null || say "warning: dev-char-links failed; next try in ${interval}s"
    chroot "$host" "$nvhook" labels --format nfd --mig-strategy "$mig_strategy" --output "$nfd_file" || say "warning: labels failed; next try in ${interval}s"
}

case $interval in
    '' | *[!0-9]*)
        say "REFRESH_INTERVAL_S=$interval: expected a number of seconds"
        exit 2
        ;;
esac
refresh
# Once a start: whether the node is ready, each problem with its fix, in the pod's log.
doctor_mode=
[ "${NVHOOK_MODE:-runtime}" != nri ] || doctor_mode=--nri
chroot "$host" "$nvhook" doctor $doctor_mode || say "warning: nvhook doctor: this node is not ready (the FAIL lines above say why)"
while [ "$interval" -gt 0 ]; do
    sleep "$interval"
    refresh
done
