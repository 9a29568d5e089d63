//! What a simulated node contains: versions, GPUs and MIG devices, derived
//! deterministically from the command line so that two nodes built with the
//! same flags describe the same hardware wherever they live.

use crate::fabric::Fabric;
use anyhow::{Context, Result, bail, ensure};
use serde::Serialize;

/// The most GPUs one node may have (NVML minors and PCI ids stay distinct).
pub const MAX_GPUS: u32 = 64;

/// The simulated board; A100 is the card most MIG documentation describes.
const GPU_NAME: &str = "NVIDIA A100-SXM4-80GB";
/// Its framebuffer as NVML reports it: 81920 MiB.
pub const GPU_MEMORY_BYTES: u64 = 80 << 30;

/// The parameters the user chose, validated.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    pub gpus: u32,
    /// (GPU index, MIG device count), GPU indices unique.
    pub mig: Vec<(u32, u32)>,
    pub driver_version: String,
    pub cuda_version: String,
    pub nvml_init_error: u32,
    pub nvml_init_delay_ms: u64,
    /// GPUs (by their place on the board, 0..gpus) that fell off the bus: NVML and the
    /// kernel no longer list them, and the GPUs after them move up an index.
    pub lost: Vec<u32>,
    /// IMEX channels, NVSwitches, GDS, MOFED, GDRCopy.
    pub fabric: Fabric,
    /// GPUs (by NVML index) whose persistence mode is off; the others have it on.
    pub persistence_off: Vec<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Gpu {
    pub index: u32,
    pub minor: u32,
    pub uuid: String,
    pub name: String,
    pub persistence_mode: bool,
    /// Bus number on PCI domain 0; rendered in NVML and kernel forms below.
    pub pci_bus: u8,
    pub mig: Vec<MigDevice>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MigDevice {
    pub uuid: String,
    pub name: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub gpu_instance: GpuInstance,
    /// The MIG device's framebuffer in bytes, as NVML reports it.
    pub memory_total: u64,
}

/// What `nvmlGpuInstanceGetInfo` says of a MIG device's GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GpuInstance {
    /// NVML's profile id, the ID column of `nvidia-smi mig -lgip`.
    pub profile_id: u32,
    /// The memory slices it holds: `placement_start..placement_start + placement_size`.
    pub placement_start: u32,
    pub placement_size: u32,
}

impl Gpu {
    /// NVML's form: 8-digit domain, upper-case hex.
    pub fn nvml_bus_id(&self) -> String {
        format!("00000000:{:02X}:00.0", self.pci_bus)
    }

    /// The kernel's form, used for /proc/driver/nvidia/gpus/<busid>.
    pub fn kernel_bus_id(&self) -> String {
        format!("0000:{:02x}:00.0", self.pci_bus)
    }
}

impl Params {
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.gpus <= MAX_GPUS,
            "--gpus {}: at most {MAX_GPUS} GPUs are supported",
            self.gpus
        );
        for (i, &(gpu, count)) in self.mig.iter().enumerate() {
            ensure!(
                gpu < self.gpus,
                "--mig {gpu}:{count}: no GPU {gpu} (the node has {} GPUs)",
                self.gpus
            );
            ensure!(
                (1..=7).contains(&count),
                "--mig {gpu}:{count}: a GPU holds 1 to 7 MIG devices"
            );
            ensure!(
                !self.mig[..i].iter().any(|&(g, _)| g == gpu),
                "--mig {gpu}: given twice; pass one --mig per GPU"
            );
        }
        for &gpu in &self.persistence_off {
            ensure!(
                gpu < self.gpus,
                "--persistence-off {gpu}: no GPU {gpu} (the node has {} GPUs)",
                self.gpus
            );
        }
        for &gpu in &self.lost {
            ensure!(
                gpu < self.gpus,
                "--lost-gpu {gpu}: no GPU {gpu} (the node has {} GPUs)",
                self.gpus
            );
        }
        driver_major(&self.driver_version)?;
        cuda_driver_version(&self.cuda_version)?;
        Ok(())
    }

    /// The GPUs NVML lists, indexed in bus order as NVML does.
    pub fn gpu_list(&self) -> Vec<Gpu> {
        (0..self.gpus)
            .filter(|slot| !self.lost.contains(slot))
            .zip(0..)
            .map(|(slot, index)| self.gpu(slot, index))
            .collect()
    }

    /// The GPU in board `slot` (which fixes its minor, UUID and bus), at NVML `index`.
    fn gpu(&self, slot: u32, index: u32) -> Gpu {
        let mig_count = self
            .mig
            .iter()
            .find(|&&(g, _)| g == index)
            .map_or(0, |&(_, c)| c);
        Gpu {
            index,
            minor: slot,
            uuid: format!("GPU-{}", uuid_hex(u64::from(slot))),
            name: GPU_NAME.to_owned(),
            persistence_mode: !self.persistence_off.contains(&index),
            // Stride 3 spreads GPUs over root ports like a real board and
            // keeps 64 GPUs below bus 0xff.
            pci_bus: u8::try_from(0x18 + 3 * slot).expect("at most 64 GPUs"),
            mig: mig_devices(index, mig_count),
        }
    }
}

/// An A100-80GB GPU instance profile, as `nvidia-smi mig -lgip` and `-lgipp` list it.
struct Profile {
    name: &'static str,
    id: u32,
    /// Memory slices per instance (of the GPU's 8).
    size: u32,
    /// `-lgip`'s memory column in MiB (9.50 GiB for 1g.10gb).
    memory_mib: u64,
    /// The GPU instance ids the driver assigns to this profile's instances, in creation order,
    /// and where each sits: the driver fills placements from the top (the MIG user guide's
    /// two 3g instances are GI 1 at 4:4 and GI 2 at 0:4).
    instances: &'static [(u32, u32)],
}

/// The profile that splits the GPU into `count` equal parts.
fn mig_profile(count: u32) -> Profile {
    match count {
        1 => Profile {
            name: "7g.80gb",
            id: 0,
            size: 8,
            memory_mib: 81_152,
            instances: &[(0, 0)],
        },
        2 => Profile {
            name: "3g.40gb",
            id: 9,
            size: 4,
            memory_mib: 40_192,
            instances: &[(1, 4), (2, 0)],
        },
        3 => Profile {
            name: "2g.20gb",
            id: 14,
            size: 2,
            memory_mib: 19_968,
            instances: &[(3, 4), (4, 2), (5, 0)],
        },
        _ => Profile {
            name: "1g.10gb",
            id: 19,
            size: 1,
            memory_mib: 9_728,
            instances: &[(7, 6), (8, 5), (9, 4), (10, 3), (11, 2), (12, 1), (13, 0)],
        },
    }
}

fn mig_devices(gpu: u32, count: u32) -> Vec<MigDevice> {
    let profile = mig_profile(count);
    profile
        .instances
        .iter()
        .take(count as usize)
        .enumerate()
        .map(|(i, &(gi, start))| MigDevice {
            // The high bit keeps MIG seeds apart from GPU seeds.
            uuid: format!("MIG-{}", uuid_hex(1 << 63 | u64::from(gpu) << 8 | i as u64)),
            name: format!("{GPU_NAME} MIG {}", profile.name),
            gpu_instance_id: gi,
            compute_instance_id: 0,
            gpu_instance: GpuInstance {
                profile_id: profile.id,
                placement_start: start,
                placement_size: profile.size,
            },
            memory_total: profile.memory_mib << 20,
        })
        .collect()
}

/// A realistic-looking, deterministic UUID body (8-4-4-4-12 hex) from a seed.
fn uuid_hex(seed: u64) -> String {
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

/// The driver's branch number (550 in 550.54.15).
pub fn driver_major(version: &str) -> Result<u32> {
    let parts: Vec<&str> = version.split('.').collect();
    let numeric = parts
        .iter()
        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if !(2..=3).contains(&parts.len()) || !numeric {
        bail!("--driver-version {version:?}: expected a dotted number like 550.54.15");
    }
    parts[0]
        .parse()
        .with_context(|| format!("--driver-version {version:?}: branch number too large"))
}

/// CUDA "12.4" as NVML reports it: 1000 * major + 10 * minor.
pub fn cuda_driver_version(version: &str) -> Result<u32> {
    let parsed = version
        .split_once('.')
        .and_then(|(major, minor)| Some((major.parse::<u32>().ok()?, minor.parse::<u32>().ok()?)));
    match parsed {
        Some((major, minor)) if minor < 100 && major < 1000 => Ok(1000 * major + 10 * minor),
        _ => bail!("--cuda-version {version:?}: expected major.minor like 12.4"),
    }
}

/// The /proc/devices name of major 195: renamed from nvidia-frontend in 550.
pub fn gpu_major_name(driver_version: &str) -> Result<&'static str> {
    Ok(if driver_major(driver_version)? < 550 {
        "nvidia-frontend"
    } else {
        "nvidia"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(gpus: u32, mig: Vec<(u32, u32)>) -> Params {
        Params {
            gpus,
            mig,
            driver_version: "550.54.15".into(),
            cuda_version: "12.4".into(),
            nvml_init_error: 0,
            nvml_init_delay_ms: 0,
            lost: vec![],
            fabric: crate::fabric::Fabric::default(),
            persistence_off: vec![],
        }
    }

    #[test]
    fn a_lost_gpu_leaves_nvmls_list_and_the_next_ones_move_up() {
        let all = params(3, vec![]).gpu_list();
        let lost = Params {
            lost: vec![1],
            ..params(3, vec![])
        }
        .gpu_list();
        let seen: Vec<(u32, u32, &str)> = lost
            .iter()
            .map(|g| (g.index, g.minor, g.uuid.as_str()))
            .collect();
        assert_eq!(
            seen,
            [(0, 0, all[0].uuid.as_str()), (1, 2, all[2].uuid.as_str())]
        );
    }

    #[test]
    fn uuids_and_bus_ids_are_distinct_and_stable() {
        let gpus = params(MAX_GPUS, vec![(0, 7), (63, 7)]).gpu_list();
        let mut ids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        ids.extend(
            gpus.iter()
                .flat_map(|g| g.mig.iter().map(|m| m.uuid.clone())),
        );
        ids.extend(gpus.iter().map(Gpu::nvml_bus_id));
        let total = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), total);
        assert_eq!(gpus[0].uuid, params(1, vec![]).gpu_list()[0].uuid);
        assert_eq!(gpus[0].nvml_bus_id(), "00000000:18:00.0");
        assert_eq!(gpus[0].kernel_bus_id(), "0000:18:00.0");
        assert_eq!(gpus[63].uuid.len(), "GPU-".len() + 36);
    }

    #[test]
    fn mig_profiles_follow_the_count() {
        let gpus = params(2, vec![(1, 2)]).gpu_list();
        assert!(gpus[0].mig.is_empty());
        let ids: Vec<u32> = gpus[1].mig.iter().map(|m| m.gpu_instance_id).collect();
        assert_eq!(ids, [1, 2]);
        assert_eq!(gpus[1].mig[0].name, "NVIDIA A100-SXM4-80GB MIG 3g.40gb");
        assert_eq!(mig_devices(0, 5).len(), 5);
        let instance = gpus[1].mig[0].gpu_instance;
        assert_eq!(instance.profile_id, 9);
        assert_eq!(gpus[1].mig[0].memory_total, 40_192 << 20);
    }

    /// No two GPU instances of a GPU share a memory slice, and all fit its 8.
    #[test]
    fn mig_placements_do_not_overlap() {
        for count in 1..=7 {
            let mut taken = [false; 8];
            for mig in mig_devices(0, count) {
                let GpuInstance {
                    placement_start: start,
                    placement_size: size,
                    ..
                } = mig.gpu_instance;
                assert_eq!(start % size, 0, "{count}: {mig:?} misaligned");
                for slice in start..start + size {
                    let slot = &mut taken[slice as usize];
                    assert!(!*slot, "{count}: slice {slice} taken twice");
                    *slot = true;
                }
            }
        }
    }

    #[test]
    fn validation_names_the_bad_flag() {
        let err = |p: Params| p.validate().unwrap_err().to_string();
        assert!(err(params(65, vec![])).contains("--gpus 65"));
        assert!(err(params(4, vec![(4, 1)])).contains("no GPU 4"));
        assert!(err(params(4, vec![(0, 8)])).contains("1 to 7"));
        assert!(err(params(4, vec![(0, 1), (0, 2)])).contains("given twice"));
        let mut bad = params(1, vec![]);
        bad.driver_version = "latest".into();
        assert!(err(bad).contains("--driver-version"));
        let mut off = params(2, vec![]);
        off.persistence_off = vec![2];
        assert!(err(off).contains("--persistence-off 2: no GPU 2"));
    }

    #[test]
    fn persistence_is_on_but_where_turned_off() {
        let off = Params {
            persistence_off: vec![1],
            ..params(3, vec![])
        };
        let modes: Vec<bool> = off.gpu_list().iter().map(|g| g.persistence_mode).collect();
        assert_eq!(modes, [true, false, true]);
    }

    #[test]
    fn versions_parse() {
        assert_eq!(cuda_driver_version("12.4").unwrap(), 12040);
        assert_eq!(cuda_driver_version("11.8").unwrap(), 11080);
        assert!(cuda_driver_version("12").is_err());
        assert_eq!(gpu_major_name("535.104.05").unwrap(), "nvidia-frontend");
        assert_eq!(gpu_major_name("550.54.15").unwrap(), "nvidia");
    }
}
