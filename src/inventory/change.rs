//! What changed on the host between two NVML answers: a driver upgrade, a GPU that fell off
//! the bus or came back, GPUs that moved to another index, MIG turned on or off or its devices
//! made anew. A start whose request can no longer be met says this in its one line, so the
//! user sees why a request that worked before fails now.

use super::nvml::System;
use super::{Gpu, MigDevice};
use std::fmt;

/// The differences, in words, most telling first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostChange(Vec<String>);

/// More than this many differences are counted, not listed: the line must stay one line.
const LISTED: usize = 4;

impl HostChange {
    /// None when the two answers describe the same GPUs with the same driver.
    pub fn between(old: &System, new: &System) -> Option<HostChange> {
        let mut changes = Vec::new();
        if old.driver_version != new.driver_version {
            changes.push(format!(
                "driver {} -> {}",
                old.driver_version, new.driver_version
            ));
        }
        for was in &old.gpus {
            match new.gpus.iter().find(|g| g.uuid == was.uuid) {
                None => changes.push(format!(
                    "GPU {} ({}, {}) is gone",
                    was.index, was.uuid, was.pci_bus_id
                )),
                Some(now) => gpu_changes(was, now, &mut changes),
            }
        }
        for now in new
            .gpus
            .iter()
            .filter(|g| !old.gpus.iter().any(|o| o.uuid == g.uuid))
        {
            changes.push(format!(
                "GPU {} ({}, {}) is new",
                now.index, now.uuid, now.pci_bus_id
            ));
        }
        (!changes.is_empty()).then_some(HostChange(changes))
    }
}

fn gpu_changes(was: &Gpu, now: &Gpu, changes: &mut Vec<String>) {
    if was.index != now.index {
        changes.push(format!(
            "GPU {} ({}) is now GPU {}",
            was.index, was.uuid, now.index
        ));
    }
    match (was.mig_enabled, now.mig_enabled) {
        (false, true) => changes.push(format!("MIG turned on on GPU {}", now.index)),
        (true, false) => changes.push(format!("MIG turned off on GPU {}", now.index)),
        _ if !same_mig_devices(&was.mig_devices, &now.mig_devices) => changes.push(format!(
            "GPU {}'s MIG devices {} -> {}",
            now.index,
            mig_list(was),
            mig_list(now)
        )),
        _ => {}
    }
}

fn same_mig_devices(a: &[MigDevice], b: &[MigDevice]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.uuid == y.uuid && x.index == y.index)
}

fn mig_list(gpu: &Gpu) -> String {
    match gpu.mig_devices.is_empty() {
        true => "none".to_owned(),
        false => gpu
            .mig_devices
            .iter()
            .map(|m| format!("{}:{}", gpu.index, m.index))
            .collect::<Vec<_>>()
            .join(","),
    }
}

impl fmt::Display for HostChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let listed = self.0.iter().take(LISTED);
        write!(f, "{}", listed.cloned().collect::<Vec<_>>().join("; "))?;
        if self.0.len() > LISTED {
            write!(f, "; and {} more", self.0.len() - LISTED)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, slot: u32) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{slot}"),
            minor: Some(slot),
            pci_bus_id: format!("0000:{:02x}:00.0", 0x18 + slot),
            name: "A100".into(),
            brand: "Nvidia".into(),
            architecture: "Ampere".into(),
            compute_capability: "8.0".into(),
            memory_mib: Some(81920),
            persistence_mode: Some(true),
            mig_capable: true,
            mig_enabled: false,
            mig_devices: vec![],
            mig_profiles: vec![],
        }
    }

    fn mig(gpu: &mut Gpu, count: u32) {
        gpu.mig_enabled = true;
        gpu.mig_devices = (0..count)
            .map(|i| MigDevice {
                index: i,
                uuid: format!("MIG-{}-{i}-{count}", gpu.uuid),
                name: "A100 MIG 1g.10gb".into(),
                gpu_instance_id: i + 1,
                compute_instance_id: 0,
                gi_cap_minor: None,
                ci_cap_minor: None,
                profile: None,
                gpu_instance_profile_id: None,
                placement: None,
                memory_mib: None,
            })
            .collect();
    }

    fn system(version: &str, gpus: Vec<Gpu>) -> System {
        System {
            driver_version: version.into(),
            cuda_version: "12.4".into(),
            gpus,
            memory_limits: false,
        }
    }

    #[test]
    fn the_same_host_is_no_change() {
        let s = system("550.54.15", vec![gpu(0, 0), gpu(1, 1)]);
        assert_eq!(HostChange::between(&s, &s.clone()), None);
    }

    #[test]
    fn a_gpu_off_the_bus_is_named_and_the_ones_after_it_moved_up() {
        let old = system("550.54.15", vec![gpu(0, 0), gpu(1, 1), gpu(2, 2)]);
        let new = system("550.54.15", vec![gpu(0, 0), gpu(1, 2)]);
        assert_eq!(
            HostChange::between(&old, &new).unwrap().to_string(),
            "GPU 1 (GPU-1, 0000:19:00.0) is gone; GPU 2 (GPU-2) is now GPU 1"
        );
    }

    #[test]
    fn a_driver_upgrade_and_a_mig_change_are_both_told() {
        let mut was = gpu(0, 0);
        mig(&mut was, 2);
        let mut now = gpu(0, 0);
        mig(&mut now, 3);
        let old = system("550.54.15", vec![was, gpu(1, 1)]);
        let mut off = gpu(1, 1);
        mig(&mut off, 1);
        let new = system("560.35.03", vec![now, off]);
        assert_eq!(
            HostChange::between(&old, &new).unwrap().to_string(),
            "driver 550.54.15 -> 560.35.03; GPU 0's MIG devices 0:0,0:1 -> 0:0,0:1,0:2; \
             MIG turned on on GPU 1"
        );
    }

    #[test]
    fn many_changes_stay_one_short_line() {
        let old = system("1", (0..8).map(|i| gpu(i, i)).collect());
        let new = system("2", vec![]);
        let text = HostChange::between(&old, &new).unwrap().to_string();
        assert!(text.ends_with("; and 5 more"), "{text}");
        assert!(!text.contains('\n'));
    }
}
