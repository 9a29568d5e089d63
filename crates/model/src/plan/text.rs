//! Human-readable text for `nvhook plan`: what a plan gives a container, and why a container
//! got no plan.

use super::Plan;
use crate::request::Decision;
use std::fmt::Write;

pub fn plan_text(plan: &Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Driver {}; libraries go to {}",
        plan.driver_version, plan.layout.lib64_dir
    );
    let _ = writeln!(s, "Selected:");
    for d in &plan.selected {
        let _ = writeln!(s, "  {} {} ({})", d.id, d.uuid, d.pci_bus_id);
    }
    let _ = writeln!(s, "Device nodes (cgroup rule):");
    for (d, r) in plan.devices.iter().zip(&plan.cgroup_rules) {
        let _ = writeln!(s, "  {} ({r})", d.path);
    }
    let _ = writeln!(s, "Mounts (ro,nosuid,nodev):");
    for m in &plan.mounts {
        let _ = writeln!(s, "  {} <- {}", m.destination, m.source.display());
    }
    let _ = writeln!(s, "Symlinks:");
    for l in &plan.symlinks {
        let _ = writeln!(s, "  {} -> {}", l.path, l.target);
    }
    if plan.layout.ldcache {
        let _ = writeln!(
            s,
            "Loader cache: {} entries added to /etc/ld.so.cache",
            plan.ldcache.len()
        );
    } else {
        let _ = writeln!(
            s,
            "Loader cache: the image has none; libraries are in the default path"
        );
    }
    if let Some(c) = &plan.cuda_compat {
        let _ = writeln!(s, "CUDA compat: {} in {}", c.reason, c.dir);
        for soname in &c.libraries {
            let _ = writeln!(s, "  {soname} -> {}/{soname}", c.dir);
        }
    }
    if let Some(p) = &plan.proc_overlay {
        let _ = writeln!(
            s,
            "/proc/driver/nvidia: overlay with gpus {}",
            p.gpus.join(", ")
        );
    }
    if !plan.skipped.is_empty() {
        let _ = writeln!(s, "Skipped (asked for, not on this host):");
        for k in &plan.skipped {
            let _ = writeln!(s, "  {}: {}", k.what, k.why);
        }
    }
    s
}

pub fn no_gpu_text(decision: &Decision) -> &'static str {
    match decision {
        Decision::EnvIgnored => {
            "empty plan: NVIDIA_VISIBLE_DEVICES is ignored for unprivileged containers (accept-env-when-unprivileged = false)"
        }
        _ => {
            "empty plan: the container asks for no GPU (NVIDIA_VISIBLE_DEVICES unset, empty or void)"
        }
    }
}
