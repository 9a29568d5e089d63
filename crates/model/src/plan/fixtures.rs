//! Hand-built inventories, plans and specs for the planner's tests and for the tests of the
//! crates above the model (the `test-util` feature): no I/O, no root.

use super::*;
use crate::inventory::{DeviceMajors, DriverFiles, Library, MigPlacement, MigProfile};
use crate::oci::Spec;
use serde_json::json;
use std::path::Path;

pub const VERSION: &str = "550.54.15";
pub const NVIDIA: u32 = 195;
pub const UVM: u32 = 511;
pub const CAPS: u32 = 510;
pub const MIG_CONFIG_MINOR: u32 = 1;
pub const MIG_MONITOR_MINOR: u32 = 2;
pub const DEV_ROOT: &str = "/node";
pub const HOST_LIB64: &str = "/drv/usr/lib/x86_64-linux-gnu";
pub const HOST_LIB32: &str = "/drv/usr/lib/i386-linux-gnu";
pub const DEBIAN_LIB64: &str = "/usr/lib/x86_64-linux-gnu";
pub const DEBIAN_LIB32: &str = "/usr/lib/i386-linux-gnu";
pub const FIRMWARE: &str = "/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin";

pub const DEBIAN: ImageInfo = ImageInfo {
    debian: true,
    has_usr_lib64: false,
    has_ldcache: true,
    cuda_compat: None,
};

// ---------------------------------------------------------------- fixtures

pub fn gpu_uuid(index: u32) -> String {
    format!("GPU-{index:08x}-1111-2222-3333-444455556666")
}

pub fn mig_uuid(gpu: u32, mig: u32) -> String {
    format!("MIG-{gpu:04x}{mig:04x}-aaaa-bbbb-cccc-ddddeeeeffff")
}

/// Kernel form, as the inventory keeps it.
pub fn bus_id(index: u32) -> String {
    format!("0000:{:02x}:00.0", 0x18 + 3 * index)
}

/// nvidia-caps minors of MIG device `mig` of GPU `gpu`: (gi, ci).
pub fn cap_minors(gpu: u32, mig: u32) -> (u32, u32) {
    let gi = 100 + 20 * gpu + 2 * mig;
    (gi, gi + 1)
}

pub fn node(path: &str, major: u32, minor: u32) -> HostNode {
    HostNode {
        path: path.into(),
        host_path: Path::new(DEV_ROOT).join(path.trim_start_matches('/')),
        major,
        minor,
        mode: 0o666,
    }
}

pub fn library(capability: Capability, soname: &str, file_name: &str, lib32: bool) -> Vec<Library> {
    let mut out = vec![(ElfClass::Lib64, HOST_LIB64)];
    if lib32 {
        out.push((ElfClass::Lib32, HOST_LIB32));
    }
    out.into_iter()
        .map(|(class, dir)| Library {
            capability,
            class,
            soname: soname.into(),
            file_name: file_name.into(),
            host_path: Path::new(dir).join(file_name),
        })
        .collect()
}

pub fn host_file(capability: Option<Capability>, path: &str) -> HostFile {
    HostFile {
        capability,
        host_path: Path::new("/drv").join(path.trim_start_matches('/')),
        container_path: path.into(),
        is_dir: false,
    }
}

pub fn driver_files() -> DriverFiles {
    use Capability::*;
    let v = |stem: &str| format!("{stem}.so.{VERSION}");
    let libraries = [
        (Utility, "libnvidia-ml.so.1", v("libnvidia-ml"), true),
        (Compute, "libcuda.so.1", v("libcuda"), true),
        (
            Compute,
            "libnvidia-ptxjitcompiler.so.1",
            v("libnvidia-ptxjitcompiler"),
            true,
        ),
        (Video, "libnvcuvid.so.1", v("libnvcuvid"), false),
        (Graphics, "libGLX_nvidia.so.0", v("libGLX_nvidia"), false),
        // The soname is the file name: no symlink.
        (
            Graphics,
            &v("libnvidia-glcore"),
            v("libnvidia-glcore"),
            false,
        ),
        (Ngx, "libnvidia-ngx.so.1", v("libnvidia-ngx"), false),
        (
            Video,
            "libnvidia-opticalflow.so.1",
            v("libnvidia-opticalflow"),
            false,
        ),
        (
            Graphics,
            &v("libnvidia-vulkan-producer"),
            v("libnvidia-vulkan-producer"),
            false,
        ),
    ]
    .iter()
    .flat_map(|(cap, soname, file, lib32)| library(*cap, soname, file, *lib32))
    .collect();
    DriverFiles {
        libraries,
        binaries: vec![
            host_file(Some(Utility), "/usr/bin/nvidia-smi"),
            host_file(Some(Compute), "/usr/bin/nvidia-cuda-mps-control"),
        ],
        firmware: vec![host_file(None, FIRMWARE)],
        sockets: vec![host_file(Some(Utility), "/run/nvidia-persistenced/socket")],
        configs: vec![host_file(
            Some(Graphics),
            "/etc/vulkan/icd.d/nvidia_icd.json",
        )],
        xorg_modules: Vec::new(),
        config_library_paths: Vec::new(),
    }
}

/// A node with `gpus` A100s; `mig` lists (GPU, number of MIG devices) for MIG-enabled GPUs.
/// Every device node the driver would create is present.
pub fn inventory(gpus: u32, mig: &[(u32, u32)]) -> Inventory {
    let mut nodes = vec![
        node("/dev/nvidiactl", NVIDIA, NVIDIACTL_MINOR),
        node("/dev/nvidia-modeset", NVIDIA, MODESET_MINOR),
        node("/dev/nvidia-uvm", UVM, 0),
        node("/dev/nvidia-uvm-tools", UVM, 1),
    ];
    for minor in [MIG_CONFIG_MINOR, MIG_MONITOR_MINOR] {
        nodes.push(node(
            &format!("/dev/nvidia-caps/nvidia-cap{minor}"),
            CAPS,
            minor,
        ));
    }
    let gpus = (0..gpus)
        .map(|index| {
            nodes.push(node(&format!("/dev/nvidia{index}"), NVIDIA, index));
            let count = mig.iter().find(|(g, _)| *g == index).map_or(0, |(_, n)| *n);
            let mig_devices = (0..count)
                .map(|m| {
                    let (gi, ci) = cap_minors(index, m);
                    for minor in [gi, ci] {
                        nodes.push(node(
                            &format!("/dev/nvidia-caps/nvidia-cap{minor}"),
                            CAPS,
                            minor,
                        ));
                    }
                    MigDevice {
                        index: m,
                        uuid: mig_uuid(index, m),
                        name: "NVIDIA A100-SXM4-80GB MIG 3g.40gb".into(),
                        gpu_instance_id: m + 1,
                        compute_instance_id: 0,
                        gi_cap_minor: Some(gi),
                        ci_cap_minor: Some(ci),
                        profile: Some("3g.40gb".into()),
                        // NVML's id of 3g.40gb; its two placements on an A100 80GB are 0 and 4.
                        gpu_instance_profile_id: Some(9),
                        placement: Some(MigPlacement {
                            start: 4 * m,
                            size: 4,
                        }),
                        memory_mib: Some(40_192),
                    }
                })
                .collect();
            Gpu {
                index,
                uuid: gpu_uuid(index),
                minor: Some(index),
                pci_bus_id: bus_id(index),
                name: "NVIDIA A100-SXM4-80GB".into(),
                brand: "tesla".into(),
                architecture: "ampere".into(),
                compute_capability: "8.0".into(),
                memory_mib: Some(81920),
                persistence_mode: Some(true),
                mig_capable: true,
                mig_enabled: count > 0,
                mig_devices,
                mig_profiles: Vec::new(),
            }
        })
        .collect();
    Inventory {
        driver_version: VERSION.into(),
        cuda_version: "12.4".into(),
        gpus,
        files: driver_files(),
        majors: DeviceMajors {
            nvidia: Some(NVIDIA),
            uvm: Some(UVM),
            caps: Some(CAPS),
            extra: vec![],
        },
        nodes,
        mig_config_minor: Some(MIG_CONFIG_MINOR),
        mig_monitor_minor: Some(MIG_MONITOR_MINOR),
        proc_driver: Some("/node/proc/driver/nvidia".into()),
        drm_nodes: Vec::new(),
        // The paths above are x86_64's, whatever machine runs the tests.
        arch: Arch::X86_64,
        memory_limits: false,
        wsl: None,
    }
}

/// The standard test node: GPUs 0-3, GPU 3 split into MIG devices 3:0 and 3:1.
/// Three of an A100 80GB's GPU instance profiles, as `nvidia-smi mig -lgip` and `-lgipp` list
/// them: 1g.10gb on each of slices 0 to 6, 3g.40gb at 0 and 4, 7g.80gb over all 8.
pub fn mig_profiles() -> Vec<MigProfile> {
    let profile =
        |id, name: &str, slices, memory_mib, sms, engines: [u32; 5], at: &[u32], size| MigProfile {
            id,
            name: name.into(),
            slices,
            memory_mib,
            multiprocessors: sms,
            copy_engines: engines[0],
            decoders: engines[1],
            encoders: engines[2],
            jpegs: engines[3],
            ofas: engines[4],
            placements: at
                .iter()
                .map(|&start| MigPlacement { start, size })
                .collect(),
        };
    vec![
        profile(
            19,
            "1g.10gb",
            1,
            9728,
            14,
            [1, 0, 0, 0, 0],
            &[0, 1, 2, 3, 4, 5, 6],
            1,
        ),
        profile(9, "3g.40gb", 3, 40192, 42, [3, 2, 0, 0, 0], &[0, 4], 4),
        profile(0, "7g.80gb", 7, 80896, 98, [7, 5, 0, 1, 1], &[0], 8),
    ]
}

pub fn standard() -> Inventory {
    inventory(4, &[(3, 2)])
}

/// A plan with one GPU node and its cgroup rule, nothing else.
pub fn one_gpu_plan() -> Plan {
    serde_json::from_value(json!({
        "driver_version": "550", "selected": [],
        "layout": {"lib64_dir": "/usr/lib", "lib32_dir": "/usr/lib32", "ldcache": false},
        "devices": [{"path": "/dev/nvidia0", "host_path": "/dev/nvidia0", "major": 195, "minor": 0, "mode": 438}],
        "cgroup_rules": [{"kind": "c", "major": 195, "minor": 0, "access": "rw"}],
        "mounts": [], "symlinks": [], "ldcache": [], "ld_so_confs": [], "proc_overlay": null
    }))
    .unwrap()
}

/// [`one_gpu_plan`] plus `/dev/nvidiactl` and its rule.
pub fn two_node_plan() -> Plan {
    let mut plan = one_gpu_plan();
    plan.devices.push(DeviceNode {
        path: "/dev/nvidiactl".into(),
        host_path: "/dev/nvidiactl".into(),
        major: 195,
        minor: 255,
        mode: 0o666,
    });
    plan.cgroup_rules.push(DeviceRule::char_rw(195, 255));
    plan
}

pub fn spec(env: &[&str], bounding: &[&str]) -> Spec {
    let doc = json!({
        "ociVersion": "1.0.2",
        "process": {"env": env, "capabilities": {"bounding": bounding}},
        "root": {"path": "rootfs"},
    });
    Spec::parse(&doc.to_string(), Path::new("config.json")).unwrap()
}
