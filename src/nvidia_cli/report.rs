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
                gpu.minor,
                gpu.name,
                gpu.brand,
                gpu.uuid,
                gpu.pci_bus_id,
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
        field(&mut out, "Device Minor", &gpu.minor);
        field(&mut out, "Model", &gpu.name);
        field(&mut out, "Brand", &gpu.brand);
        field(&mut out, "GPU UUID", &gpu.uuid);
        field(&mut out, "Bus Location", &gpu.pci_bus_id);
        field(&mut out, "Architecture", &gpu.compute_capability);
    }
    out
}

/// One `Name:` line, the name padded to 15 columns as libnvidia-container prints it.
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

/// `list`: host paths by the kinds asked for. `selected` is what the plan of a container given
/// `list.devices` holds (its GPUs' nodes and MIG access files), listed after the driver's
/// control nodes; with no `--device`, `selected` is empty and `list.all_nodes` lists every node.
pub fn list_text(inventory: &Inventory, list: &List, selected: &[DeviceNode]) -> String {
    let mut lines: Vec<String> = Vec::new();
    let shown = |path: &std::path::Path| path.display().to_string();
    if list.all_nodes {
        lines.extend(inventory.nodes.iter().map(|n| shown(&n.host_path)));
    } else if !selected.is_empty() {
        let control = CONTROL_NODES
            .iter()
            .filter_map(|path| inventory.nodes.iter().find(|n| n.path == *path));
        lines.extend(control.map(|n| shown(&n.host_path)));
        lines.extend(selected.iter().map(|n| shown(&n.host_path)));
    }
    if list.binaries {
        lines.extend(inventory.files.binaries.iter().map(|f| shown(&f.host_path)));
    }
    if list.libraries {
        let wanted = |class: ElfClass| class == ElfClass::Lib64 || list.compat32;
        lines.extend(
            inventory
                .files
                .libraries
                .iter()
                .filter(|l| wanted(l.class))
                .map(|l| shown(&l.host_path)),
        );
    }
    if list.ipcs {
        lines.extend(inventory.files.sockets.iter().map(|f| shown(&f.host_path)));
    }
    // A library two capabilities share (libnvidia-allocator) is one file.
    let mut seen = std::collections::HashSet::new();
    lines
        .into_iter()
        .filter(|l| seen.insert(l.clone()))
        .map(|l| l + "\n")
        .collect()
}
