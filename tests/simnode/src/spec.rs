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

/// The A100-80GB profile that splits the GPU into `count` equal parts, with
/// the GPU instance ids the driver assigns to that profile's placements.
fn mig_profile(count: u32) -> (&'static str, &'static [u32]) {
    match count {
        1 => ("7g.80gb", &[0]),
        2 => ("3g.40gb", &[1, 2]),
        3 => ("2g.20gb", &[3, 4, 5]),
        _ => ("1g.10gb", &[7, 8, 9, 10, 11, 12, 13]),
    }
}

fn mig_devices(gpu: u32, count: u32) -> Vec<MigDevice> {
    let (profile, gi_ids) = mig_profile(count);
    gi_ids
        .iter()
        .take(count as usize)
        .enumerate()
        .map(|(i, &gi)| MigDevice {
            // The high bit keeps MIG seeds apart from GPU seeds.
            uuid: format!("MIG-{}", uuid_hex(1 << 63 | u64::from(gpu) << 8 | i as u64)),
            name: format!("{GPU_NAME} MIG {profile}"),
            gpu_instance_id: gi,
            compute_instance_id: 0,
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
