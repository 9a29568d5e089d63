//! NVIDIA's DRA driver's device names, which claims and selectors written for it hold.

use crate::inventory::{Gpu, MigDevice};

/// The number NVIDIA's names give `gpu`: its minor. A GPU with none (WSL2's, where NVIDIA's DRA
/// driver does not run) is numbered by its NVML index, which is unique on the node too.
pub fn gpu_number(gpu: &Gpu) -> u32 {
    gpu.minor.unwrap_or(gpu.index)
}

/// NVIDIA's name for a static MIG device:
/// `gpu-<parent minor>-mig-<profile>-<GPU instance profile id>-<placement start>`, the profile
/// without its dots and made a DNS label (`1g.10gb` → `1g10gb`, `1g.10gb+me` → `1g10gb-me`).
/// Unique on a node, as no two GPU instances of a GPU start at the same slice.
pub fn mig_name(gpu: &Gpu, mig: &MigDevice) -> Option<String> {
    place_name(
        gpu,
        mig.profile.as_deref()?,
        mig.gpu_instance_profile_id?,
        mig.placement?.start,
    )
}

/// [`mig_name`] of a MIG device of `profile` (NVML's id `profile_id`) starting at memory slice
/// `start`, made or not.
pub fn place_name(gpu: &Gpu, profile: &str, profile_id: u32, start: u32) -> Option<String> {
    let profile = rfc1123(&profile.replace('.', ""));
    if profile.is_empty() {
        return None;
    }
    Some(format!(
        "gpu-{}-mig-{profile}-{profile_id}-{start}",
        gpu_number(gpu)
    ))
}

/// NVIDIA's `toRFC1123Compliant`: lower case, each character outside `[a-z0-9.-]` a `-`,
/// leading and trailing `-` and a trailing `.` trimmed, at most 253 characters.
fn rfc1123(text: &str) -> String {
    let mapped: String = text
        .to_lowercase()
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            _ => '-',
        })
        .collect();
    let trimmed = mapped.trim_matches('-');
    let trimmed = trimmed.strip_suffix('.').unwrap_or(trimmed);
    trimmed.chars().take(253).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvhook_model::inventory::MigPlacement;
    use nvhook_model::plan::fixtures::inventory;

    #[test]
    fn mig_profiles_are_made_dns_labels_as_nvidia_does() {
        let inv = inventory(1, &[(0, 1)]);
        let (gpu, mut mig) = (&inv.gpus[0], inv.gpus[0].mig_devices[0].clone());
        mig.gpu_instance_profile_id = Some(20);
        mig.placement = Some(MigPlacement { start: 3, size: 1 });
        let name = |profile: &str, mig: &mut MigDevice| {
            mig.profile = Some(profile.into());
            mig_name(gpu, mig)
        };
        assert_eq!(
            name("1g.10gb+me", &mut mig).as_deref(),
            Some("gpu-0-mig-1g10gb-me-20-3")
        );
        assert_eq!(
            name("1c.2g.20gb", &mut mig).as_deref(),
            Some("gpu-0-mig-1c2g20gb-20-3")
        );
        assert_eq!(
            name("1G.10GB", &mut mig).as_deref(),
            Some("gpu-0-mig-1g10gb-20-3")
        );
        assert_eq!(name("+", &mut mig), None);
    }
}
