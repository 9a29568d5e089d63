//! The numbers of NVIDIA's device nodes and how the kernel lists them, as plain data: the
//! fixed ones, and the parsers of `/proc/devices` and the driver's capability files.

use serde::{Deserialize, Serialize};

/// Minors the driver gives its control nodes under the GPU major; majors themselves are
/// read from /proc/devices (all but the GPU's are assigned at module load).
pub const NVIDIACTL_MINOR: u32 = 255;
pub const MODESET_MINOR: u32 = 254;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMajors {
    /// None on a WSL2 host, whose GPUs are reached through `/dev/dxg` (a misc device), not
    /// through a major of NVIDIA's.
    pub nvidia: Option<u32>,
    pub uvm: Option<u32>,
    pub caps: Option<u32>,
    /// The majors of IMEX channels and of the opt-in device families, with their
    /// `/proc/devices` names (one name may hold several majors, one major several names).
    #[serde(default)]
    pub extra: Vec<(u32, String)>,
}

impl DeviceMajors {
    /// Whether `major` is registered under one of `names`.
    pub fn is_named(&self, major: u32, names: &[&str]) -> bool {
        self.extra
            .iter()
            .any(|(m, n)| *m == major && names.contains(&n.as_str()))
    }

    /// The first major registered as `name`.
    pub fn named(&self, name: &str) -> Option<u32> {
        self.extra.iter().find(|(_, n)| n == name).map(|(m, _)| *m)
    }
}

/// Parses the "Character devices:" section of /proc/devices.
pub fn parse_proc_devices(text: &str) -> Option<DeviceMajors> {
    let mut nvidia = None;
    let mut uvm = None;
    let mut caps = None;
    let mut extra = Vec::new();
    let char_section = text
        .split("Block devices:")
        .next()
        .unwrap_or_default()
        .lines();
    for line in char_section {
        let Some((major, name)) = line.trim().split_once(char::is_whitespace) else {
            continue;
        };
        let Ok(major) = major.parse::<u32>() else {
            continue;
        };
        match name.trim() {
            // The GPU major's name changed with driver 550.
            "nvidia" | "nvidia-frontend" => nvidia = Some(major),
            "nvidia-uvm" => uvm = Some(major),
            "nvidia-caps" => caps = Some(major),
            name if crate::imex_and_families::is_major_name(name) => {
                extra.push((major, name.to_string()))
            }
            _ => {}
        }
    }
    Some(DeviceMajors {
        nvidia: Some(nvidia?),
        uvm,
        caps,
        extra,
    })
}

/// The `DeviceFileMinor: N` line of a driver capability file.
pub fn parse_cap_minor(text: &str) -> Option<u32> {
    text.lines()
        .find_map(|l| l.strip_prefix("DeviceFileMinor:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_devices_new_and_old_names() {
        let text = "Character devices:\n  1 mem\n195 nvidia\n234 nvidia-uvm\n235 nvidia-caps\n\nBlock devices:\n195 nvidia\n";
        let m = parse_proc_devices(text).unwrap();
        assert_eq!(
            m,
            DeviceMajors {
                nvidia: Some(195),
                uvm: Some(234),
                caps: Some(235),
                extra: vec![]
            }
        );
        let old = "Character devices:\n195 nvidia-frontend\n\nBlock devices:\n";
        assert_eq!(parse_proc_devices(old).unwrap().uvm, None);
        assert_eq!(parse_proc_devices(old).unwrap().nvidia, Some(195));
    }

    #[test]
    fn proc_devices_extra_majors() {
        let text = "Character devices:\n 10 misc\n195 nvidia\n231 infiniband_verbs\n231 infiniband_mad\n509 nvidia-caps-imex-channels\n510 nvidia-nvswitch\n\nBlock devices:\n 10 gdrdrv\n";
        let m = parse_proc_devices(text).unwrap();
        assert_eq!(m.named("nvidia-caps-imex-channels"), Some(509));
        assert!(m.is_named(231, &["infiniband_mad"]) && m.is_named(231, &["infiniband_verbs"]));
        assert!(
            m.is_named(10, &["misc"]) && !m.is_named(10, &["gdrdrv"]),
            "block devices do not count"
        );
        assert!(!m.is_named(510, &["nvidia-fs"]));
    }

    #[test]
    fn proc_devices_without_driver() {
        assert!(
            parse_proc_devices("Character devices:\n  1 mem\n\nBlock devices:\n 195 nvidia\n")
                .is_none()
        );
        assert!(parse_proc_devices("").is_none());
    }

    #[test]
    fn cap_minor() {
        assert_eq!(
            parse_cap_minor("DeviceFileMinor: 12\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
            Some(12)
        );
        assert_eq!(parse_cap_minor("garbage"), None);
    }
}
