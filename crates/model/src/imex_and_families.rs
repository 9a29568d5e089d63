//! Device nodes beyond the GPUs' own: IMEX channels and the opt-in device families
//! (NVSwitch, GPUDirect Storage, MOFED/RDMA, GDRCopy), as plain data.
//!
//! Which host nodes belong to what, and under which `/proc/devices` names their majors are
//! registered: majors are never assumed, a node counts only when its own numbers carry a
//! major the kernel lists under one of its family's names.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Where the driver puts IMEX channel nodes, `channel<N>` with minor N.
pub const IMEX_DIR: &str = "/dev/nvidia-caps-imex-channels";
/// The `/proc/devices` name of the IMEX channels' major.
pub const IMEX_MAJOR_NAME: &str = "nvidia-caps-imex-channels";

/// An opt-in device family, asked for with `NVIDIA_<NAME>=enabled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    NvSwitch,
    Gds,
    Mofed,
    GdrCopy,
}

/// Which names in a directory a family's nodes have.
#[derive(Debug, Clone, Copy)]
enum Name {
    Exact(&'static str),
    Prefix(&'static str),
}

/// A kind of node: its directory, its names, and the `/proc/devices` names its major may have.
#[derive(Debug, Clone, Copy)]
pub struct NodeKind {
    pub dir: &'static str,
    name: Name,
    pub major_names: &'static [&'static str],
}

impl NodeKind {
    /// Whether the container path `path` (`/dev/infiniband/uverbs0`) is of this kind.
    pub fn matches(&self, path: &str) -> bool {
        path.rsplit_once('/')
            .is_some_and(|(dir, name)| self.matches_entry(dir, name))
    }

    /// Whether entry `name` of container directory `dir` is of this kind.
    pub fn matches_entry(&self, dir: &str, name: &str) -> bool {
        dir == self.dir
            && match self.name {
                Name::Exact(n) => name == n,
                Name::Prefix(p) => name.starts_with(p),
            }
    }

    /// `/dev/nvidia-fs*`, for messages.
    pub fn pattern(&self) -> String {
        match self.name {
            Name::Exact(n) => format!("{}/{n}", self.dir),
            Name::Prefix(p) => format!("{}/{p}*", self.dir),
        }
    }
}

const fn kind(dir: &'static str, name: Name, major_names: &'static [&'static str]) -> NodeKind {
    NodeKind {
        dir,
        name,
        major_names,
    }
}

/// The IMEX channel nodes.
pub const IMEX_CHANNEL: NodeKind = kind(IMEX_DIR, Name::Prefix("channel"), &[IMEX_MAJOR_NAME]);

const NVSWITCH: &[NodeKind] = &[
    // `nvidia-nvswitchctl` and `nvidia-nvswitch<N>` share the major.
    kind(
        "/dev",
        Name::Prefix("nvidia-nvswitch"),
        &["nvidia-nvswitch"],
    ),
    kind("/dev", Name::Exact("nvidia-nvlink"), &["nvidia-nvlink"]),
];
const GDS: &[NodeKind] = &[kind("/dev", Name::Prefix("nvidia-fs"), &["nvidia-fs"])];
const MOFED: &[NodeKind] = &[
    kind(
        "/dev/infiniband",
        Name::Prefix("uverbs"),
        &["infiniband_verbs"],
    ),
    // The RDMA connection manager is a misc device (major 10, dynamic minor).
    kind("/dev/infiniband", Name::Exact("rdma_cm"), &["misc"]),
    kind("/dev/infiniband", Name::Prefix("umad"), &["infiniband_mad"]),
];
const GDRCOPY: &[NodeKind] = &[kind("/dev", Name::Exact("gdrdrv"), &["gdrdrv"])];

impl Family {
    pub const ALL: [Family; 4] = [
        Family::NvSwitch,
        Family::Gds,
        Family::Mofed,
        Family::GdrCopy,
    ];

    /// The variable a container sets to `enabled` to ask for the family.
    pub fn variable(self) -> &'static str {
        match self {
            Family::NvSwitch => "NVIDIA_NVSWITCH",
            Family::Gds => "NVIDIA_GDS",
            Family::Mofed => "NVIDIA_MOFED",
            Family::GdrCopy => "NVIDIA_GDRCOPY",
        }
    }

    /// The config key and the name `nvhook plan` shows.
    pub fn name(self) -> &'static str {
        match self {
            Family::NvSwitch => "nvswitch",
            Family::Gds => "gds",
            Family::Mofed => "mofed",
            Family::GdrCopy => "gdrcopy",
        }
    }

    pub fn nodes(self) -> &'static [NodeKind] {
        match self {
            Family::NvSwitch => NVSWITCH,
            Family::Gds => GDS,
            Family::Mofed => MOFED,
            Family::GdrCopy => GDRCOPY,
        }
    }

    /// What the host lacks when it has none of the family's nodes, for the skip message.
    pub fn module_hint(self) -> &'static str {
        match self {
            Family::NvSwitch => "no NVSwitch or NVLink nodes: not an NVSwitch system",
            Family::Gds => "no nvidia-fs nodes: the GPUDirect Storage module is not loaded",
            Family::Mofed => "no InfiniBand/RDMA nodes: no RDMA device or driver",
            Family::GdrCopy => "no gdrdrv node: the GDRCopy module is not loaded",
        }
    }

    /// `/dev/nvidia-fs*`, `/dev/gdrdrv`: the family's nodes, for messages.
    pub fn patterns(self) -> String {
        self.nodes()
            .iter()
            .map(NodeKind::pattern)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every kind of extra node the host scan and the majors table must know.
pub fn all_kinds() -> impl Iterator<Item = &'static NodeKind> {
    Family::ALL
        .iter()
        .flat_map(|f| f.nodes())
        .chain(std::iter::once(&IMEX_CHANNEL))
}

/// Whether `/proc/devices` name `name` is one the extra nodes' majors may have.
pub fn is_major_name(name: &str) -> bool {
    all_kinds().any(|k| k.major_names.contains(&name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_match_only_their_own_paths() {
        let kind_of = |path: &str| -> Vec<String> {
            all_kinds()
                .filter(|k| k.matches(path))
                .map(NodeKind::pattern)
                .collect()
        };
        assert_eq!(
            kind_of("/dev/nvidia-nvswitchctl"),
            ["/dev/nvidia-nvswitch*"]
        );
        assert_eq!(kind_of("/dev/nvidia-nvswitch3"), ["/dev/nvidia-nvswitch*"]);
        assert_eq!(kind_of("/dev/nvidia-nvlink"), ["/dev/nvidia-nvlink"]);
        assert_eq!(kind_of("/dev/nvidia-fs7"), ["/dev/nvidia-fs*"]);
        assert_eq!(
            kind_of("/dev/infiniband/uverbs1"),
            ["/dev/infiniband/uverbs*"]
        );
        assert_eq!(
            kind_of("/dev/infiniband/rdma_cm"),
            ["/dev/infiniband/rdma_cm"]
        );
        assert_eq!(kind_of("/dev/infiniband/umad0"), ["/dev/infiniband/umad*"]);
        assert_eq!(kind_of("/dev/gdrdrv"), ["/dev/gdrdrv"]);
        assert_eq!(
            kind_of("/dev/nvidia-caps-imex-channels/channel2"),
            ["/dev/nvidia-caps-imex-channels/channel*"]
        );
        for other in [
            "/dev/nvidia0",
            "/dev/gdrdrv0",
            "/dev/rdma_cm",
            "/dev/infiniband/issm0",
            "/dev/x/nvidia-fs0",
            "gdrdrv",
        ] {
            assert!(kind_of(other).is_empty(), "{other}");
        }
    }

    #[test]
    fn major_names() {
        for name in [
            "nvidia-caps-imex-channels",
            "infiniband_verbs",
            "misc",
            "gdrdrv",
        ] {
            assert!(is_major_name(name), "{name}");
        }
        assert!(!is_major_name("nvidia") && !is_major_name("mem"));
    }
}
