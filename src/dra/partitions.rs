//! A GPU in MIG mode offered as partitionable devices (Kubernetes' KEP-4815; NVIDIA's driver
//! does it behind its DynamicMIG gate): every place a MIG profile can take on the GPU is a
//! device, and the devices share the GPU's counters (its memory slices, multiprocessors and
//! engines), so the scheduler never gives two overlapping places at once. The MIG device is
//! made when a claim for its place is prepared, and destroyed when the claim is unprepared.

use super::names::{gpu_number, mig_name, place_name};
use crate::inventory::{Gpu, MigDevice, MigPlacement, MigProfile};
use std::collections::BTreeSet;

/// A place a MIG profile can take on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// The GPU's NVML index.
    pub gpu: u32,
    /// NVML's GPU instance profile id.
    pub profile_id: u32,
    pub placement: MigPlacement,
}

/// A partition offered as a device of the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The name of the MIG device made there.
    pub name: String,
    pub partition: Partition,
    /// The MIG index of the MIG device there now, if there is one.
    pub made: Option<u32>,
}

/// The MIG devices of `gpu` as partitions: one device for each place each profile can take,
/// named as a static MIG device made there would be, so that a device keeps its name whether
/// or not its MIG device exists yet. A place is left out where a MIG device nvhook-dra did not
/// make (the operator's) overlaps it without being exactly it: making a MIG device there would
/// fail. `made_here` names the devices nvhook-dra made for the claims it holds.
pub fn partitions(gpu: &Gpu, made_here: &BTreeSet<String>) -> Vec<Place> {
    let mut out = Vec::new();
    for profile in &gpu.mig_profiles {
        for placement in &profile.placements {
            let Some(name) = place_name(gpu, &profile.name, profile.id, placement.start) else {
                continue;
            };
            let existing = gpu.mig_devices.iter().find(|m| {
                m.gpu_instance_profile_id == Some(profile.id) && m.placement == Some(*placement)
            });
            let blocked = gpu.mig_devices.iter().any(|m| {
                existing.is_none_or(|e| e.index != m.index)
                    && overlaps(m, placement)
                    && !mig_name(gpu, m).is_some_and(|n| made_here.contains(&n))
            });
            if blocked {
                continue;
            }
            out.push(Place {
                name,
                partition: Partition {
                    gpu: gpu.index,
                    profile_id: profile.id,
                    placement: *placement,
                },
                made: existing.map(|m| m.index),
            });
        }
    }
    out
}

/// Whether `mig`'s memory slices meet `placement`'s. A MIG device NVML did not place is taken
/// to meet every place: nothing is offered over it.
fn overlaps(mig: &MigDevice, placement: &MigPlacement) -> bool {
    mig.placement.is_none_or(|p| {
        p.start < placement.start + placement.size && placement.start < p.start + p.size
    })
}

/// The counters a GPU's partitions share, under NVIDIA's names, with what the whole GPU has:
/// the most any profile holds of each, and one `memory-slice-<i>` for each memory slice.
pub fn counters(gpu: &Gpu) -> Vec<(String, u64)> {
    let mut most = [0; 7];
    for profile in &gpu.mig_profiles {
        for (m, value) in most.iter_mut().zip(profile_counts(profile)) {
            *m = (*m).max(value);
        }
    }
    let mut out: Vec<(String, u64)> = COUNTS
        .iter()
        .zip(most)
        .map(|(name, value)| (name.to_string(), value))
        .collect();
    let slices = gpu
        .mig_profiles
        .iter()
        .flat_map(|p| &p.placements)
        .map(|p| p.start + p.size)
        .max()
        .unwrap_or(0);
    out.extend((0..slices).map(|i| (format!("memory-slice-{i}"), 1)));
    out
}

/// What the partition of `profile` at `placement` takes of its GPU's counters.
pub fn consumed(profile: &MigProfile, placement: &MigPlacement) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = COUNTS
        .iter()
        .zip(profile_counts(profile))
        .map(|(name, value)| (name.to_string(), value))
        .collect();
    out.extend(
        (placement.start..placement.start + placement.size)
            .map(|i| (format!("memory-slice-{i}"), 1)),
    );
    out
}

/// The counters (DNS labels) of a profile's capacities, in [`profile_counts`]' order.
const COUNTS: [&str; 7] = [
    "multiprocessors",
    "copy-engines",
    "decoders",
    "encoders",
    "jpeg-engines",
    "ofa-engines",
    "memory",
];

/// A profile's capacities, counted as [`COUNTS`] names them; `memory` in bytes.
fn profile_counts(p: &MigProfile) -> [u64; 7] {
    [
        u64::from(p.multiprocessors),
        u64::from(p.copy_engines),
        u64::from(p.decoders),
        u64::from(p.encoders),
        u64::from(p.jpegs),
        u64::from(p.ofas),
        p.memory_mib * 1024 * 1024,
    ]
}

/// The name of `gpu`'s counter set: NVIDIA's.
pub fn counter_set(gpu: &Gpu) -> String {
    format!("gpu-{}-counter-set", gpu_number(gpu))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvhook_model::plan::fixtures::{inventory, mig_profiles};

    /// GPU 0 of a node, in MIG mode with an A100's profiles, holding `migs` (profile id,
    /// placement start) made by someone.
    fn gpu(migs: &[(u32, u32)]) -> Gpu {
        let mut gpu = inventory(1, &[(0, 1)]).gpus.remove(0);
        let template = gpu.mig_devices.remove(0);
        gpu.mig_profiles = mig_profiles();
        for (index, &(id, start)) in (0..).zip(migs) {
            let profile = gpu.mig_profiles.iter().find(|p| p.id == id).unwrap();
            let size = profile.placements[0].size;
            gpu.mig_devices.push(MigDevice {
                index,
                uuid: format!("MIG-{index}"),
                profile: Some(profile.name.clone()),
                gpu_instance_profile_id: Some(id),
                placement: Some(MigPlacement { start, size }),
                ..template.clone()
            });
        }
        gpu
    }

    fn names(offered: &[Place]) -> Vec<(&str, Option<u32>)> {
        offered.iter().map(|p| (p.name.as_str(), p.made)).collect()
    }

    #[test]
    fn every_place_of_every_profile_is_a_device_named_as_its_mig_device_would_be() {
        let offered = partitions(&gpu(&[]), &BTreeSet::new());
        let expected: Vec<String> = (0..7)
            .map(|s| format!("gpu-0-mig-1g10gb-19-{s}"))
            .chain(["gpu-0-mig-3g40gb-9-0".into(), "gpu-0-mig-3g40gb-9-4".into()])
            .chain(["gpu-0-mig-7g80gb-0-0".into()])
            .collect();
        let got: Vec<String> = names(&offered).iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(got, expected);
        assert!(names(&offered).iter().all(|(_, made)| made.is_none()));
        assert_eq!(
            offered[8].partition,
            Partition {
                gpu: 0,
                profile_id: 9,
                placement: MigPlacement { start: 4, size: 4 }
            }
        );
    }

    #[test]
    fn an_operators_mig_device_is_offered_as_itself_and_nothing_over_it() {
        let gpu = gpu(&[(9, 4)]);
        let offered = partitions(&gpu, &BTreeSet::new());
        assert_eq!(
            names(&offered),
            [
                ("gpu-0-mig-1g10gb-19-0", None),
                ("gpu-0-mig-1g10gb-19-1", None),
                ("gpu-0-mig-1g10gb-19-2", None),
                ("gpu-0-mig-1g10gb-19-3", None),
                ("gpu-0-mig-3g40gb-9-0", None),
                ("gpu-0-mig-3g40gb-9-4", Some(0)),
            ]
        );
        // One nvhook-dra made for a claim leaves every place offered: the scheduler keeps
        // the overlapping ones from other claims through the counters.
        let ours = BTreeSet::from(["gpu-0-mig-3g40gb-9-4".to_string()]);
        let offered = partitions(&gpu, &ours);
        assert_eq!(offered.len(), 10);
        assert!(names(&offered).contains(&("gpu-0-mig-3g40gb-9-4", Some(0))));
    }

    #[test]
    fn the_counters_are_the_whole_gpus_and_a_place_takes_its_profiles_and_slices() {
        let gpu = gpu(&[]);
        assert_eq!(counter_set(&gpu), "gpu-0-counter-set");
        let counters: Vec<(String, u64)> = counters(&gpu);
        let mut expected: Vec<(String, u64)> = [
            ("multiprocessors", 98),
            ("copy-engines", 7),
            ("decoders", 5),
            ("encoders", 0),
            ("jpeg-engines", 1),
            ("ofa-engines", 1),
            ("memory", 80896 * 1024 * 1024),
        ]
        .map(|(n, v)| (n.to_string(), v))
        .to_vec();
        expected.extend((0..8).map(|i| (format!("memory-slice-{i}"), 1)));
        assert_eq!(counters, expected);
        let three = &gpu.mig_profiles[1];
        let taken = consumed(three, &three.placements[1]);
        let slices: Vec<&str> = taken
            .iter()
            .filter(|(n, _)| n.starts_with("memory-slice-"))
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(
            slices,
            [
                "memory-slice-4",
                "memory-slice-5",
                "memory-slice-6",
                "memory-slice-7"
            ]
        );
        assert!(taken.contains(&("multiprocessors".to_string(), 42)));
        assert!(taken.contains(&("memory".to_string(), 40192 * 1024 * 1024)));
    }
}
