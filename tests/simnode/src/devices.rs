//! Character device nodes with the numbers the NVIDIA driver would use. No
//! driver backs them: 195 is unregistered here and the dynamic majors are
//! chosen free, so opening any of them fails with ENXIO, which tests use.

use crate::spec::Gpu;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

pub const GPU_MAJOR: u32 = 195;
const CTL_MINOR: u32 = 255;
const MODESET_MINOR: u32 = 254;
/// Top of the kernel's dynamic character major range (384..=511).
const DYNAMIC_TOP: u32 = 511;
const DYNAMIC_BOTTOM: u32 = 234;

/// The two majors the driver would get from the kernel at load time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Majors {
    pub uvm: u32,
    pub caps: u32,
}

impl Majors {
    /// Two majors the host has not registered, scanning down from 511.
    pub fn pick() -> Result<Majors> {
        Self::pick_avoiding(&[])
    }

    /// Two free majors that are not `old`'s: the driver's module loaded again.
    pub fn pick_other_than(old: Majors) -> Result<Majors> {
        Self::pick_avoiding(&[old.uvm, old.caps])
    }

    fn pick_avoiding(avoid: &[u32]) -> Result<Majors> {
        let text = fs::read_to_string("/proc/devices")
            .context("cannot read /proc/devices: is /proc mounted?")?;
        let used = registered_char_majors(&text);
        let mut free = (DYNAMIC_BOTTOM..=DYNAMIC_TOP)
            .rev()
            .filter(|m| *m != GPU_MAJOR && !used.contains(m) && !avoid.contains(m));
        match (free.next(), free.next()) {
            (Some(uvm), Some(caps)) => Ok(Majors { uvm, caps }),
            _ => bail!(
                "no two free character majors in {DYNAMIC_BOTTOM}..={DYNAMIC_TOP} on this host"
            ),
        }
    }
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
pub fn make_nodes(dev_dir: &Path, gpus: &[Gpu], majors: Majors, caps: &[Capability]) -> Result<()> {
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
    Ok(())
}

fn mknod(path: &Path, major: u32, minor: u32, mode: u32) -> Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes()).context("device path contains NUL")?;
    // SAFETY: c_path is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mknod(
            c_path.as_ptr(),
            libc::S_IFCHR | mode,
            libc::makedev(major, minor),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        bail!(
            "mknod {} c {major} {minor}: {err} (simnode must run as root)",
            path.display()
        );
    }
    // mknod applied the umask; the driver's modes are exact.
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Params;

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
            persistence_off: vec![],
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
