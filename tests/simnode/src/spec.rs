//! What a simulated node contains: versions, GPUs and MIG devices, derived
//! deterministically from the command line so that two nodes built with the
//! same flags describe the same hardware wherever they live.

use crate::fabric::Fabric;
use anyhow::{Context, Result, bail, ensure};
use serde::Serialize;

/// The most GPUs one node may have (NVML minors and PCI ids stay distinct).
pub const MAX_GPUS: u32 = 64;

use simmig::{GPU_NAME, Profile, uuid_hex};
/// Its framebuffer as NVML reports it: 81920 MiB.
pub const GPU_MEMORY_BYTES: u64 = 80 << 30;

/// The parameters the user chose, validated.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    pub gpus: u32,
    /// (GPU index, MIG device count), GPU indices unique; a count of 0 is MIG mode on with no
    /// MIG device.
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
    /// The mock's memory limit calls answer NOT_SUPPORTED, as for GPUs the driver cannot
    /// limit.
    pub memory_limits_not_supported: bool,
    /// A WSL2 guest instead of a Linux host with NVIDIA's kernel module (`wsl`).
    pub wsl: bool,
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
    pub mig_enabled: bool,
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
                count <= 7,
                "--mig {gpu}:{count}: a GPU holds 0 to 7 MIG devices"
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
        let mig_count = self.mig.iter().find(|&&(g, _)| g == index).map(|&(_, c)| c);
        Gpu {
            index,
            minor: slot,
            uuid: format!("GPU-{}", uuid_hex(u64::from(slot))),
            name: GPU_NAME.to_owned(),
            persistence_mode: !self.persistence_off.contains(&index),
            // Stride 3 spreads GPUs over root ports like a real board and
            // keeps 64 GPUs below bus 0xff.
            pci_bus: u8::try_from(0x18 + 3 * slot).expect("at most 64 GPUs"),
            mig_enabled: mig_count.is_some(),
            mig: mig_devices(index, mig_count.unwrap_or(0)),
        }
    }
}

/// The profile that splits the GPU into `count` equal parts, and the placements its
/// instances take, in the order the driver fills them: from the top.
fn mig_layout(count: u32) -> (&'static Profile, &'static [u32]) {
    let (name, starts): (&str, &'static [u32]) = match count {
        1 => ("7g.80gb", &[0]),
        2 => ("3g.40gb", &[4, 0]),
        3 => ("2g.20gb", &[4, 2, 0]),
        _ => ("1g.10gb", &[6, 5, 4, 3, 2, 1, 0]),
    };
    let profile = Profile::by_name(name).expect("an A100-80GB profile");
    (profile, starts)
}

fn mig_devices(gpu: u32, count: u32) -> Vec<MigDevice> {
    if count == 0 {
        return Vec::new();
    }
    let (profile, starts) = mig_layout(count);
    starts
        .iter()
        .take(count as usize)
        .enumerate()
        .map(|(i, &start)| MigDevice {
            // The high bit keeps MIG seeds apart from GPU seeds.
            uuid: format!("MIG-{}", uuid_hex(1 << 63 | u64::from(gpu) << 8 | i as u64)),
            name: format!("{GPU_NAME} MIG {}", profile.name),
            gpu_instance_id: simmig::gpu_instance_id(start, profile.size)
                .expect("a placement of the profile"),
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
            memory_limits_not_supported: false,
            wsl: false,
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
        let empty = params(1, vec![(0, 0)]).gpu_list();
        assert!(empty[0].mig_enabled && empty[0].mig.is_empty());
        assert!(!params(1, vec![]).gpu_list()[0].mig_enabled);
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
        assert!(err(params(4, vec![(0, 8)])).contains("0 to 7"));
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
            memory_limits_not_supported: false,
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
