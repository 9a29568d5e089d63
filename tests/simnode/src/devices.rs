//! Character device nodes with the numbers the NVIDIA driver would use. No
//! driver backs them: 195 is unregistered here and the dynamic majors are
//! chosen free, so opening any of them fails with ENXIO, which tests use.

use crate::fabric::Fabric;
use crate::spec::Gpu;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::Path;

pub const GPU_MAJOR: u32 = 195;
/// The kernel's fixed DRM major; unregistered on a host without a GPU, so its nodes give ENXIO.
pub const DRM_MAJOR: u32 = 226;
/// Render nodes are numbered from 128.
pub const RENDER_MINOR_BASE: u32 = 128;
const CTL_MINOR: u32 = 255;
const MODESET_MINOR: u32 = 254;
/// Top of the kernel's dynamic character major range (384..=511).
const DYNAMIC_TOP: u32 = 511;
const DYNAMIC_BOTTOM: u32 = 234;

/// The majors the driver's modules (and the fabric's, see `fabric`) would get from the
/// kernel at load time, and the misc minor of the RDMA connection manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Majors {
    pub uvm: u32,
    pub caps: u32,
    pub imex: u32,
    pub nvswitch: u32,
    pub nvlink: u32,
    pub nvidia_fs: u32,
    pub gdrdrv: u32,
    /// `infiniband_verbs` and `infiniband_mad` share it, as on a real host.
    pub infiniband: u32,
    pub rdma_cm_minor: u32,
}

/// Dynamic majors a node needs.
const DYNAMIC_MAJORS: usize = 8;

impl Majors {
    /// Majors the host has not registered, scanning down from 511.
    pub fn pick() -> Result<Majors> {
        Self::pick_avoiding(&[])
    }

    /// Free majors that are not `old`'s: the driver's module loaded again.
    pub fn pick_other_than(old: Majors) -> Result<Majors> {
        Self::pick_avoiding(&old.dynamic())
    }

    fn dynamic(&self) -> [u32; DYNAMIC_MAJORS] {
        [
            self.uvm,
            self.caps,
            self.imex,
            self.nvswitch,
            self.nvlink,
            self.nvidia_fs,
            self.gdrdrv,
            self.infiniband,
        ]
    }

    fn pick_avoiding(avoid: &[u32]) -> Result<Majors> {
        let text = fs::read_to_string("/proc/devices")
            .context("cannot read /proc/devices: is /proc mounted?")?;
        let used = registered_char_majors(&text);
        let free: Vec<u32> = (DYNAMIC_BOTTOM..=DYNAMIC_TOP)
            .rev()
            .filter(|m| *m != GPU_MAJOR && !used.contains(m) && !avoid.contains(m))
            .take(DYNAMIC_MAJORS)
            .collect();
        let [
            uvm,
            caps,
            imex,
            nvswitch,
            nvlink,
            nvidia_fs,
            gdrdrv,
            infiniband,
        ] = free[..]
        else {
            bail!(
                "no {DYNAMIC_MAJORS} free character majors in {DYNAMIC_BOTTOM}..={DYNAMIC_TOP} on this host"
            );
        };
        let misc = fs::read_to_string("/proc/misc")
            .context("cannot read /proc/misc: is /proc mounted?")?;
        Ok(Majors {
            uvm,
            caps,
            imex,
            nvswitch,
            nvlink,
            nvidia_fs,
            gdrdrv,
            infiniband,
            rdma_cm_minor: free_misc_minor(&misc)?,
        })
    }
}

/// A misc minor the host has not registered: no device answers there, so opening the node
/// fails with ENODEV where the cgroup allows it.
fn free_misc_minor(proc_misc: &str) -> Result<u32> {
    let used: Vec<u32> = proc_misc
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    // Below 255 (MISC_DYNAMIC_MINOR), from the top, where dynamic minors start.
    (128..255)
        .rev()
        .find(|m| !used.contains(m))
        .context("no free misc minor on this host")
}

/// Majors listed under "Character devices:" in /proc/devices.
fn registered_char_majors(proc_devices: &str) -> Vec<u32> {
    proc_devices
        .lines()
        .skip_while(|l| !l.starts_with("Character devices:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// One `nvidia-caps` capability: its proc file and the node it announces.
#[derive(Debug, Clone)]
pub struct Capability {
    /// Relative to the proc root's driver/nvidia/capabilities.
    pub proc_path: String,
    pub minor: u32,
    pub mode: u32,
}

/// The MIG capabilities: config and monitor, then each MIG device's GPU
/// instance and compute instance access.
pub fn capabilities(gpus: &[Gpu]) -> Vec<Capability> {
    // Config and monitor are root-only (0400), access files world-readable
    // (0444), as the driver sets them.
    let mut caps = vec![
        Capability {
            proc_path: "mig/config".into(),
            minor: 1,
            mode: 0o400,
        },
        Capability {
            proc_path: "mig/monitor".into(),
            minor: 2,
            mode: 0o400,
        },
    ];
    for gpu in gpus {
        for mig in &gpu.mig {
            let (gi, ci) = (mig.gpu_instance_id, mig.compute_instance_id);
            let gi_minor = gi_access_minor(gpu.minor, gi);
            let gi_dir = format!("gpu{}/mig/gi{gi}", gpu.minor);
            caps.push(Capability {
                proc_path: format!("{gi_dir}/access"),
                minor: gi_minor,
                mode: 0o444,
            });
            caps.push(Capability {
                proc_path: format!("{gi_dir}/ci{ci}/access"),
                minor: gi_minor + 1 + ci,
                mode: 0o444,
            });
        }
    }
    caps
}

/// The driver's numbering: minors 0-2 are global, then each GPU owns 15
/// GPU-instance blocks of 9 minors (the GI itself and its 8 CIs).
fn gi_access_minor(gpu_minor: u32, gi: u32) -> u32 {
    3 + gpu_minor * 15 * 9 + gi * 9
}

/// Makes every node under `dev_dir` (which is DIR/dev).
pub fn make_nodes(
    dev_dir: &Path,
    gpus: &[Gpu],
    majors: Majors,
    caps: &[Capability],
    fabric: &Fabric,
) -> Result<()> {
    let caps_dir = dev_dir.join("nvidia-caps");
    fs::create_dir_all(&caps_dir)
        .with_context(|| format!("cannot create {}", caps_dir.display()))?;
    for gpu in gpus {
        mknod(
            &dev_dir.join(format!("nvidia{}", gpu.minor)),
            GPU_MAJOR,
            gpu.minor,
            0o666,
        )?;
    }
    mknod(&dev_dir.join("nvidiactl"), GPU_MAJOR, CTL_MINOR, 0o666)?;
    mknod(
        &dev_dir.join("nvidia-modeset"),
        GPU_MAJOR,
        MODESET_MINOR,
        0o666,
    )?;
    mknod(&dev_dir.join("nvidia-uvm"), majors.uvm, 0, 0o666)?;
    mknod(&dev_dir.join("nvidia-uvm-tools"), majors.uvm, 1, 0o666)?;
    for cap in caps {
        let node = caps_dir.join(format!("nvidia-cap{}", cap.minor));
        mknod(&node, majors.caps, cap.minor, cap.mode)?;
    }
    for (path, major, minor) in fabric.nodes(majors) {
        let node = dev_dir.join(path);
        let dir = node.parent().expect("a node lives in a directory");
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        mknod(&node, major, minor, 0o666)?;
    }
    Ok(())
}

/// Each GPU's DRM nodes, as nvidia-drm makes them: card<minor> and renderD<128+minor>.
pub fn make_drm_nodes(dev_dir: &Path, gpus: &[Gpu]) -> Result<()> {
    let dri = dev_dir.join("dri");
    fs::create_dir_all(&dri).with_context(|| format!("cannot create {}", dri.display()))?;
    for gpu in gpus {
        for (name, minor, mode) in drm_nodes(gpu) {
            mknod(&dri.join(name), DRM_MAJOR, minor, mode)?;
        }
    }
    Ok(())
}

/// A GPU's DRM node names, minors and modes (the card node is the video group's, 0660).
pub fn drm_nodes(gpu: &Gpu) -> [(String, u32, u32); 2] {
    let render = RENDER_MINOR_BASE + gpu.minor;
    [
        (format!("card{}", gpu.minor), gpu.minor, 0o660),
        (format!("renderD{render}"), render, 0o666),
    ]
}

fn mknod(path: &Path, major: u32, minor: u32, mode: u32) -> Result<()> {
    simmig::mknod(path, major, minor, mode).with_context(|| {
        format!(
            "mknod {} c {major} {minor} (simnode must run as root)",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Params;

    #[test]
    fn misc_minor_is_one_the_host_lacks() {
        assert_eq!(
            free_misc_minor(" 58 rdma_cm\n254 x\n183 hw_random\n").unwrap(),
            253
        );
    }

    #[test]
    fn parses_only_character_majors() {
        let text =
            "Character devices:\n  1 mem\n195 nvidia\n\nBlock devices:\n  7 loop\n259 blkext\n";
        assert_eq!(registered_char_majors(text), [1, 195]);
    }

    #[test]
    fn mig_minors_match_the_driver_numbering() {
        let params = Params {
            gpus: 2,
            mig: vec![(0, 2), (1, 2)],
            driver_version: "550.54.15".into(),
            cuda_version: "12.4".into(),
            nvml_init_error: 0,
            nvml_init_delay_ms: 0,
            lost: vec![],
            fabric: Fabric::default(),
            persistence_off: vec![],
            memory_limits_not_supported: false,
            wsl: false,
        };
        let caps = capabilities(&params.gpu_list());
        let minor = |p: &str| caps.iter().find(|c| c.proc_path == p).unwrap().minor;
        // Known values from a real MIG node: gpu0 gi1 = 12, gi1/ci0 = 13, gi2 = 21.
        assert_eq!(minor("gpu0/mig/gi1/access"), 12);
        assert_eq!(minor("gpu0/mig/gi1/ci0/access"), 13);
        assert_eq!(minor("gpu0/mig/gi2/access"), 21);
        assert_eq!(minor("gpu1/mig/gi1/access"), 147);
        assert_eq!(caps.len(), 2 + 2 * 2 * 2);
    }
}
