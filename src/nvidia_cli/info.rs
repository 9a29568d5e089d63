//! `nvidia-container-cli info` and `list`, from nvhook's inventory, in the shapes
//! libnvidia-container prints and scripts parse: `info`'s 15-column `Name: value` blocks (or
//! `--csv`), `list`'s one host path a line, devices first.

use super::List;
use crate::inventory::Inventory;
use crate::plan::DeviceNode;
use nvhook_ldcache::ElfClass;
use std::fmt::Write as _;

/// `info` (`--csv`: the same facts as two CSV tables).
pub fn info_text(inventory: &Inventory, csv: bool) -> String {
    let mut out = String::new();
    if csv {
        let _ = writeln!(
            out,
            "NVRM version,CUDA version\n{},{}",
            inventory.driver_version, inventory.cuda_version
        );
        out.push_str(
            "\nDevice Index,Device Minor,Model,Brand,GPU UUID,Bus Location,Architecture\n",
        );
        for gpu in &inventory.gpus {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{}",
                gpu.index,
                minor(gpu),
                gpu.name,
                brand(&gpu.brand),
                gpu.uuid,
                bus_location(&gpu.pci_bus_id),
                gpu.compute_capability
            );
        }
        return out;
    }
    field(&mut out, "NVRM version", &inventory.driver_version);
    field(&mut out, "CUDA version", &inventory.cuda_version);
    for gpu in &inventory.gpus {
        out.push('\n');
        field(&mut out, "Device Index", &gpu.index);
        field(&mut out, "Device Minor", &minor(gpu));
        field(&mut out, "Model", &gpu.name);
        field(&mut out, "Brand", &brand(&gpu.brand));
        field(&mut out, "GPU UUID", &gpu.uuid);
        field(&mut out, "Bus Location", &bus_location(&gpu.pci_bus_id));
        field(&mut out, "Architecture", &gpu.compute_capability);
    }
    out
}

/// libnvidia-container's name of an NVML brand (nvhook's inventory keeps NVML's enum name in
/// lower case: `tesla`, `nvidiartx`, ...).
fn brand(nvml: &str) -> &'static str {
    const NAMES: [(&str, &str); 16] = [
        ("quadro", "Quadro"),
        ("tesla", "Tesla"),
        ("nvs", "NVS"),
        ("grid", "GRID"),
        ("geforce", "GeForce"),
        ("titan", "TITAN"),
        ("nvidiavapps", "VApps"),
        ("nvidiavpc", "VPC"),
        ("nvidiavcs", "VCS"),
        ("nvidiavws", "VWS"),
        ("nvidiacloudgaming", "CloudGaming"),
        ("quadrortx", "QuadroRTX"),
        ("nvidiartx", "NvidiaRTX"),
        ("nvidia", "Nvidia"),
        ("geforcertx", "GeForceRTX"),
        ("titanrtx", "TitanRTX"),
    ];
    let key: String = nvml
        .chars()
        .filter(|c| *c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let key = key.strip_prefix("brand").unwrap_or(&key);
    NAMES
        .iter()
        .find(|(k, _)| *k == key || k.strip_prefix("nvidia") == Some(key))
        .map_or("Unknown", |(_, name)| name)
}

/// libnvidia-container's bus location, `%08x:%02x:%02x.0` of the PCI domain, bus and
/// device (`0000:18:00.0` -> `00000000:18:00.0`); anything else as it is.
fn bus_location(bus_id: &str) -> String {
    let parts: Vec<&str> = bus_id.split([':', '.']).collect();
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    match parts[..] {
        [domain, bus, device, _] => match (hex(domain), hex(bus), hex(device)) {
            (Some(d), Some(b), Some(v)) => format!("{d:08x}:{b:02x}:{v:02x}.0"),
            _ => bus_id.to_string(),
        },
        _ => bus_id.to_string(),
    }
}

/// One `Name:` line, the name padded to 15 columns as libnvidia-container prints it.
/// A GPU's minor as libnvidia-container prints it: 0 for WSL2's, which have none.
fn minor(gpu: &crate::inventory::Gpu) -> u32 {
    gpu.minor.unwrap_or(0)
}

fn field(out: &mut String, name: &str, value: &dyn std::fmt::Display) {
    let _ = writeln!(out, "{:<15} {value}", format!("{name}:"));
}

/// The driver's own nodes, which libnvidia-container lists before any GPU's, where they exist.
const CONTROL_NODES: [&str; 4] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

/// `list`: host paths by the kinds asked for, in libnvidia-container's order: the driver's
/// control nodes, the GPUs' nodes (all of them with no `--device`, else those of the plan's
/// `selected` nodes: its GPUs' nodes and MIG access files), IMEX channel nodes, binaries,
/// libraries (64-bit, then 32-bit), IPC sockets, firmware.
pub fn list_text(inventory: &Inventory, list: &List, selected: &[DeviceNode]) -> String {
    let mut lines: Vec<String> = Vec::new();
    let shown = |path: &std::path::Path| path.display().to_string();
    let control = || {
        CONTROL_NODES
            .iter()
            .filter_map(|path| inventory.nodes.iter().find(|n| n.path == *path))
    };
    if list.all_nodes {
        lines.extend(control().map(|n| shown(&n.host_path)));
        let mut gpus: Vec<_> = inventory
            .nodes
            .iter()
            .filter(|n| gpu_index(&n.path).is_some())
            .collect();
        gpus.sort_by_key(|n| gpu_index(&n.path));
        lines.extend(gpus.iter().map(|n| shown(&n.host_path)));
        lines.extend(
            inventory
                .nodes
                .iter()
                .filter(|n| {
                    !CONTROL_NODES.contains(&n.path.as_str()) && gpu_index(&n.path).is_none()
                })
                .map(|n| shown(&n.host_path)),
        );
    } else if !selected.is_empty() {
        lines.extend(control().map(|n| shown(&n.host_path)));
        lines.extend(selected.iter().map(|n| shown(&n.host_path)));
    }
    if list.binaries {
        lines.extend(inventory.files.binaries.iter().map(|f| shown(&f.host_path)));
    }
    if list.libraries {
        for class in [ElfClass::Lib64, ElfClass::Lib32] {
            if class == ElfClass::Lib32 && !list.compat32 {
                continue;
            }
            lines.extend(
                inventory
                    .files
                    .libraries
                    .iter()
                    .filter(|l| l.class == class)
                    .map(|l| shown(&l.host_path)),
            );
        }
    }
    if list.ipcs {
        lines.extend(inventory.files.sockets.iter().map(|f| shown(&f.host_path)));
    }
    if list.firmwares {
        lines.extend(inventory.files.firmware.iter().map(|f| shown(&f.host_path)));
    }
    // A library two capabilities share (libnvidia-allocator) is one file.
    let mut seen = std::collections::HashSet::new();
    lines
        .into_iter()
        .filter(|l| seen.insert(l.clone()))
        .map(|l| l + "\n")
        .collect()
}

/// N of a GPU's node `/dev/nvidiaN`.
fn gpu_index(path: &str) -> Option<u32> {
    path.strip_prefix("/dev/nvidia")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brands_and_bus_locations_as_libnvidia_container_prints_them() {
        for (nvml, want) in [
            ("tesla", "Tesla"),
            ("geforcertx", "GeForceRTX"),
            ("nvidiartx", "NvidiaRTX"),
            ("nvidia", "Nvidia"),
            ("nvidiacloudgaming", "CloudGaming"),
            ("vws", "VWS"),
            ("unknown", "Unknown"),
        ] {
            assert_eq!(brand(nvml), want, "{nvml}");
        }
        assert_eq!(bus_location("0000:18:00.0"), "00000000:18:00.0");
        assert_eq!(bus_location("0001:AF:1f.3"), "00000001:af:1f.0");
        assert_eq!(bus_location("weird"), "weird");
    }
}
