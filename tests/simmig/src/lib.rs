//! The simulated GPU's MIG, one definition for the two programs that lay it out: simnode, which
//! builds a node with MIG devices already made, and the mock NVML, which makes and removes them
//! later. Both must number GPU instances, nvidia-caps minors and capability files exactly alike,
//! or a device made by one would not be the device the other made.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The board every simulated GPU is.
pub const GPU_NAME: &str = "NVIDIA A100-SXM4-80GB";

/// A GPU instance profile of the A100-80GB, as `nvidia-smi mig -lgip` and `-lgipp` list it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` index NVML describes it under.
    pub index: u32,
    /// NVML's profile id, the ID column of `-lgip`.
    pub id: u32,
    pub name: &'static str,
    /// Compute slices.
    pub slices: u32,
    /// Memory slices an instance holds (of the GPU's 8): its placements' size.
    pub size: u32,
    /// How many instances of it the GPU holds at most.
    pub instances: u32,
    pub memory_mib: u64,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
    /// The first memory slice of each placement, `-lgipp`'s list.
    pub starts: &'static [u32],
}

const ALL_1G: &[u32] = &[0, 1, 2, 3, 4, 5, 6];

/// The A100-80GB's GPU instance profiles.
pub const A100_80GB: &[Profile] = &[
    Profile {
        index: 0,
        id: 19,
        name: "1g.10gb",
        slices: 1,
        size: 1,
        instances: 7,
        memory_mib: 9_728,
        multiprocessors: 14,
        copy_engines: 1,
        decoders: 0,
        encoders: 0,
        jpegs: 0,
        ofas: 0,
        starts: ALL_1G,
    },
    Profile {
        index: 1,
        id: 14,
        name: "2g.20gb",
        slices: 2,
        size: 2,
        instances: 3,
        memory_mib: 19_968,
        multiprocessors: 28,
        copy_engines: 2,
        decoders: 1,
        encoders: 0,
        jpegs: 0,
        ofas: 0,
        starts: &[0, 2, 4],
    },
    Profile {
        index: 2,
        id: 9,
        name: "3g.40gb",
        slices: 3,
        size: 4,
        instances: 2,
        memory_mib: 40_192,
        multiprocessors: 42,
        copy_engines: 3,
        decoders: 2,
        encoders: 0,
        jpegs: 0,
        ofas: 0,
        starts: &[0, 4],
    },
    Profile {
        index: 3,
        id: 5,
        name: "4g.40gb",
        slices: 4,
        size: 4,
        instances: 1,
        memory_mib: 40_192,
        multiprocessors: 56,
        copy_engines: 4,
        decoders: 2,
        encoders: 0,
        jpegs: 0,
        ofas: 0,
        starts: &[0],
    },
    Profile {
        index: 4,
        id: 0,
        name: "7g.80gb",
        slices: 7,
        size: 8,
        instances: 1,
        memory_mib: 81_152,
        multiprocessors: 98,
        copy_engines: 7,
        decoders: 5,
        encoders: 0,
        jpegs: 1,
        ofas: 1,
        starts: &[0],
    },
    Profile {
        index: 7,
        id: 20,
        name: "1g.10gb+me",
        slices: 1,
        size: 1,
        instances: 1,
        memory_mib: 9_728,
        multiprocessors: 14,
        copy_engines: 1,
        decoders: 1,
        encoders: 0,
        jpegs: 1,
        ofas: 1,
        starts: ALL_1G,
    },
    Profile {
        index: 9,
        id: 15,
        name: "1g.20gb",
        slices: 1,
        size: 2,
        instances: 4,
        memory_mib: 19_968,
        multiprocessors: 14,
        copy_engines: 1,
        decoders: 1,
        encoders: 0,
        jpegs: 0,
        ofas: 0,
        starts: &[0, 2, 4, 6],
    },
];

impl Profile {
    pub fn by_index(index: u32) -> Option<&'static Profile> {
        A100_80GB.iter().find(|p| p.index == index)
    }

    pub fn by_id(id: u32) -> Option<&'static Profile> {
        A100_80GB.iter().find(|p| p.id == id)
    }

    pub fn by_name(name: &str) -> Option<&'static Profile> {
        A100_80GB.iter().find(|p| p.name == name)
    }
}

/// The multiprocessors of one compute slice.
pub const MULTIPROCESSORS_PER_SLICE: u32 = 14;

/// The compute instance profiles (`NVML_COMPUTE_INSTANCE_PROFILE_*`, whose index is also their
/// id on an A100) by compute slices: 1, 2, 3, 4 and 7.
pub const COMPUTE_PROFILE_SLICES: [u32; 5] = [1, 2, 3, 4, 7];

/// The driver's GPU instance id for memory slices `start..start + size`: fixed by the place,
/// whichever profile fills it (the MIG user guide's two 3g instances are GI 1 at 4:4 and GI 2
/// at 0:4; its seven 1g instances are GI 7 at 6 down to GI 13 at 0).
pub fn gpu_instance_id(start: u32, size: u32) -> Option<u32> {
    let (first, order): (u32, &[u32]) = match size {
        8 => (0, &[0]),
        4 => (1, &[4, 0]),
        2 => (3, &[4, 2, 0, 6]),
        1 => (7, &[6, 5, 4, 3, 2, 1, 0, 7]),
        _ => return None,
    };
    let at = order.iter().position(|&s| s == start)?;
    Some(first + at as u32)
}

/// The most GPU instances (ids 0 to 14) and compute instances (0 to 7) of one GPU.
pub const MAX_GPU_INSTANCES: u32 = 15;
pub const MAX_COMPUTE_INSTANCES: u32 = 8;

/// The nvidia-caps minor of GPU instance `gi` of the GPU with minor `gpu_minor`: minors 0-2 are
/// global, then each GPU owns 15 GPU-instance blocks of 9 minors (the GI itself and its 8 CIs).
pub fn gi_access_minor(gpu_minor: u32, gi: u32) -> u32 {
    3 + gpu_minor * MAX_GPU_INSTANCES * (1 + MAX_COMPUTE_INSTANCES)
        + gi * (1 + MAX_COMPUTE_INSTANCES)
}

/// The nvidia-caps minor of compute instance `ci` in that GPU instance.
pub fn ci_access_minor(gpu_minor: u32, gi: u32, ci: u32) -> u32 {
    gi_access_minor(gpu_minor, gi) + 1 + ci
}

/// The capability file of GPU instance `gi` of GPU `gpu_minor`, under the driver's
/// `capabilities` directory.
pub fn gi_access_path(gpu_minor: u32, gi: u32) -> String {
    format!("gpu{gpu_minor}/mig/gi{gi}/access")
}

/// The capability file of compute instance `ci` in it.
pub fn ci_access_path(gpu_minor: u32, gi: u32, ci: u32) -> String {
    format!("gpu{gpu_minor}/mig/gi{gi}/ci{ci}/access")
}

/// The mode of GPU and compute instance access files and nodes: world-readable, as the driver
/// sets them.
pub const ACCESS_MODE: u32 = 0o444;

/// A capability file's text, in the driver's format.
pub fn capability_text(minor: u32, mode: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")
}

/// `/dev/nvidia-caps/nvidia-cap<minor>`'s name.
pub fn cap_node_name(minor: u32) -> String {
    format!("nvidia-cap{minor}")
}

/// Makes character device `path` with exactly `mode` (mknod applies the umask).
pub fn mknod(path: &Path, major: u32, minor: u32, mode: u32) -> io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: c_path is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mknod(
            c_path.as_ptr(),
            libc::S_IFCHR | mode,
            libc::makedev(major, minor),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// A realistic-looking, deterministic UUID body (8-4-4-4-12 hex) from a seed.
pub fn uuid_hex(seed: u64) -> String {
    let hi = splitmix64(seed ^ 0x6e76_686f_6f6b_0001);
    let lo = splitmix64(hi ^ seed);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placement_has_its_own_gpu_instance_id() {
        let mut seen = Vec::new();
        for profile in A100_80GB {
            for &start in profile.starts {
                assert_eq!(
                    start % profile.size.min(4),
                    0,
                    "{} at {start}",
                    profile.name
                );
                assert!(start + profile.size <= 8, "{} at {start}", profile.name);
                let id = gpu_instance_id(start, profile.size).unwrap();
                assert!(id < MAX_GPU_INSTANCES);
                seen.push((id, start, profile.size));
            }
        }
        seen.sort();
        seen.dedup();
        let mut ids: Vec<u32> = seen.iter().map(|s| s.0).collect();
        ids.dedup();
        assert_eq!(ids.len(), seen.len(), "one id per place: {seen:?}");
        assert_eq!(gpu_instance_id(4, 4), Some(1));
        assert_eq!(gpu_instance_id(0, 1), Some(13));
        assert_eq!(gpu_instance_id(1, 4), None);
    }

    #[test]
    fn profiles_are_found_by_index_id_and_name() {
        assert_eq!(Profile::by_id(9).unwrap().name, "3g.40gb");
        assert_eq!(Profile::by_index(7).unwrap().id, 20);
        assert_eq!(Profile::by_name("7g.80gb").unwrap().size, 8);
        assert!(
            Profile::by_index(5).is_none(),
            "no 8-slice profile on an A100"
        );
    }

    #[test]
    fn minors_follow_the_drivers_numbering() {
        // Known values from a real MIG node: gpu0 gi1 = 12, gi1/ci0 = 13, gi2 = 21.
        assert_eq!(gi_access_minor(0, 1), 12);
        assert_eq!(ci_access_minor(0, 1, 0), 13);
        assert_eq!(gi_access_minor(0, 2), 21);
        assert_eq!(gi_access_minor(1, 1), 147);
    }
}
