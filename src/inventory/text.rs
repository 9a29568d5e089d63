//! Human-readable text for `nvhook info`.

use crate::elf_machine::DriverArch;
use crate::inventory::Inventory;
use nvhook_model::inventory::wsl;
use std::fmt::Write;

/// Like `nvidia-container-cli info`: driver, then one block per GPU, then the files found.
/// `driver` is the architecture of the driver's libraries ([`crate::elf_machine::driver_arch`]).
pub fn inventory_text(inv: &Inventory, driver: Option<&DriverArch>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "NVRM version:   {}", inv.driver_version);
    let _ = writeln!(s, "CUDA version:   {}", inv.cuda_version);
    let _ = writeln!(s, "Driver arch:    {}", driver_arch_text(driver));
    let _ = writeln!(
        s,
        "Memory limits:  {}",
        match inv.memory_limits {
            true => "per container (nvmlDeviceSetMemoryLimits_v1; cgroup v2, whole GPUs)",
            false =>
                "no (the driver has no nvmlDeviceSetMemoryLimits_v1: CUDA 13.4's driver added it)",
        }
    );
    for g in &inv.gpus {
        let _ = writeln!(s);
        let _ = writeln!(s, "Device Index:   {}", g.index);
        let _ = match g.minor {
            Some(minor) => writeln!(s, "Device Minor:   {minor}"),
            None => writeln!(s, "Device Minor:   none (WSL2: every GPU is {})", wsl::DXG),
        };
        let _ = writeln!(s, "Model:          {}", g.name);
        let _ = writeln!(s, "Brand:          {}", g.brand);
        let _ = writeln!(s, "GPU UUID:       {}", g.uuid);
        let _ = writeln!(s, "Bus Location:   {}", g.pci_bus_id);
        let _ = writeln!(
            s,
            "Architecture:   {} ({})",
            g.compute_capability, g.architecture
        );
        if let Some(mib) = g.memory_mib {
            let _ = writeln!(s, "Memory:         {mib} MiB");
        }
        if let Some(on) = g.persistence_mode {
            let _ = writeln!(s, "Persistence:    {}", if on { "on" } else { "off" });
        }
        let _ = writeln!(
            s,
            "MIG:            {}",
            match (g.mig_enabled, g.mig_capable) {
                (true, _) => "enabled",
                (false, true) => "disabled",
                (false, false) => "not supported",
            }
        );
        for m in &g.mig_devices {
            let _ = writeln!(
                s,
                "  MIG {}:{}       {} (GI {}, CI {})",
                g.index, m.index, m.uuid, m.gpu_instance_id, m.compute_instance_id
            );
        }
    }
    let _ = writeln!(s, "\nDriver files:");
    for lib in &inv.files.libraries {
        let _ = writeln!(
            s,
            "  {:<9} {:?}  {} -> {}",
            lib.capability.name(),
            lib.class,
            lib.soname,
            lib.host_path.display()
        );
    }
    let files = &inv.files;
    for f in files
        .binaries
        .iter()
        .chain(&files.firmware)
        .chain(&files.sockets)
        .chain(&files.configs)
        .chain(&files.xorg_modules)
    {
        let cap = f.capability.map_or("any", |c| c.name());
        let _ = writeln!(s, "  {:<9} {}", cap, f.host_path.display());
    }
    if let Some(driver) = &inv.wsl {
        let _ = writeln!(s, "  WSL2 driver store {}", driver.store);
        for f in &driver.files {
            let _ = writeln!(s, "  {:<9} {}", "wsl", f.host_path.display());
        }
    }
    let _ = writeln!(s, "\nDevice nodes:");
    let mut nodes = inv
        .nodes
        .iter()
        .chain(inv.drm_nodes.iter().map(|d| &d.node))
        .chain(inv.wsl.iter().map(|w| &w.dxg))
        .peekable();
    if nodes.peek().is_none() {
        let _ = writeln!(s, "  none");
    }
    for n in nodes {
        let _ = writeln!(s, "  {} {}:{}", n.path, n.major, n.minor);
    }
    s
}

/// `aarch64 (/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1)`, or why it is unknown.
fn driver_arch_text(driver: Option<&DriverArch>) -> String {
    match driver {
        None => "unknown (no libnvidia-ml.so.1 or libcuda.so.1 found)".to_string(),
        Some(d) => {
            let library = d.library.display();
            match (&d.machine, &d.error) {
                (Some(machine), _) => format!("{machine} ({library})"),
                (None, why) => format!(
                    "unknown ({library}: {})",
                    why.as_deref().unwrap_or("no machine")
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn info_names_the_driver_architecture_or_why_not() {
        let inv = nvhook_model::plan::fixtures::standard();
        let arm = DriverArch {
            machine: Some("aarch64".into()),
            error: None,
            library: PathBuf::from("/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"),
        };
        let text = inventory_text(&inv, Some(&arm));
        assert_eq!(
            text.lines().nth(2),
            Some("Driver arch:    aarch64 (/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1)")
        );
        let damaged = DriverArch {
            machine: None,
            error: Some("not an ELF file".into()),
            ..arm
        };
        assert!(inventory_text(&inv, Some(&damaged)).contains(
            "Driver arch:    unknown (/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1: not an ELF file)"
        ));
        assert!(
            inventory_text(&inv, None)
                .contains("Driver arch:    unknown (no libnvidia-ml.so.1 or libcuda.so.1 found)")
        );
    }

    #[test]
    fn info_says_whether_the_driver_limits_gpu_memory() {
        let mut inv = nvhook_model::plan::fixtures::standard();
        let line = |inv: &Inventory| inventory_text(inv, None).lines().nth(3).map(String::from);
        assert_eq!(
            line(&inv).as_deref(),
            Some(
                "Memory limits:  no (the driver has no nvmlDeviceSetMemoryLimits_v1: CUDA 13.4's driver added it)"
            )
        );
        inv.memory_limits = true;
        assert_eq!(
            line(&inv).as_deref(),
            Some(
                "Memory limits:  per container (nvmlDeviceSetMemoryLimits_v1; cgroup v2, whole GPUs)"
            )
        );
    }
}
