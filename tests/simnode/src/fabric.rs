//! The devices around the GPUs a node may have: IMEX channels, NVSwitches with NVLink, GPUDirect
//! Storage (nvidia-fs), an InfiniBand/RDMA adapter (MOFED) and GDRCopy. Each is made only when
//! asked for, with a major the node's /proc/devices registers, as its kernel module would.

use crate::devices::Majors;
use serde::Serialize;

/// nvidia-fs makes this many nodes.
const NVIDIA_FS_NODES: u32 = 4;
/// The NVSwitch control node's minor, beside the switches' own 0..N.
const NVSWITCHCTL_MINOR: u32 = 255;
/// uverbs minors start here under the InfiniBand major; umad's start at 0.
const UVERBS_BASE_MINOR: u32 = 192;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Fabric {
    pub imex_channels: u32,
    pub nvswitches: u32,
    pub gds: bool,
    pub mofed: bool,
    pub gdrcopy: bool,
}

impl Fabric {
    /// Every node: (path under the node's dev/, major, minor).
    pub fn nodes(&self, majors: Majors) -> Vec<(String, u32, u32)> {
        let mut out = Vec::new();
        for channel in 0..self.imex_channels {
            out.push((
                format!("nvidia-caps-imex-channels/channel{channel}"),
                majors.imex,
                channel,
            ));
        }
        if self.nvswitches > 0 {
            out.push((
                "nvidia-nvswitchctl".into(),
                majors.nvswitch,
                NVSWITCHCTL_MINOR,
            ));
            for switch in 0..self.nvswitches {
                out.push((format!("nvidia-nvswitch{switch}"), majors.nvswitch, switch));
            }
            out.push(("nvidia-nvlink".into(), majors.nvlink, 0));
        }
        if self.gds {
            for n in 0..NVIDIA_FS_NODES {
                out.push((format!("nvidia-fs{n}"), majors.nvidia_fs, n));
            }
        }
        if self.mofed {
            out.push((
                "infiniband/uverbs0".into(),
                majors.infiniband,
                UVERBS_BASE_MINOR,
            ));
            out.push(("infiniband/umad0".into(), majors.infiniband, 0));
            out.push(("infiniband/rdma_cm".into(), 10, majors.rdma_cm_minor));
        }
        if self.gdrcopy {
            out.push(("gdrdrv".into(), majors.gdrdrv, 0));
        }
        out
    }

    /// The character majors the modules register: (major, /proc/devices name). The IMEX
    /// channels' is nvidia.ko's own, there whether or not channels exist.
    pub fn proc_devices(&self, majors: Majors) -> Vec<(u32, &'static str)> {
        let mut out = vec![(majors.imex, "nvidia-caps-imex-channels")];
        if self.nvswitches > 0 {
            out.push((majors.nvswitch, "nvidia-nvswitch"));
            out.push((majors.nvlink, "nvidia-nvlink"));
        }
        if self.gds {
            out.push((majors.nvidia_fs, "nvidia-fs"));
        }
        if self.mofed {
            out.push((majors.infiniband, "infiniband_verbs"));
            out.push((majors.infiniband, "infiniband_mad"));
        }
        if self.gdrcopy {
            out.push((majors.gdrdrv, "gdrdrv"));
        }
        out
    }
}
