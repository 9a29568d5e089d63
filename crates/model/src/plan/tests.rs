//! Unit tests of `plan::build` on a hand-built inventory: no I/O, no root.

use super::fixtures::*;
use super::*;
use crate::config::Config;
use crate::device_rule::DeviceRule;
use crate::request::Request;
use std::path::Path;

fn request_of(env: &[&str], bounding: &[&str]) -> Option<Request> {
    Request::from_spec(&spec(env, bounding), &Config::default())
        .unwrap_or_else(|e| panic!("{env:?}: {e}"))
}

fn request(env: &[&str]) -> Request {
    request_of(env, &["CAP_CHOWN"]).unwrap_or_else(|| panic!("{env:?} is not a GPU request"))
}

fn plan_on(inv: &Inventory, env: &[&str], image: ImageInfo) -> Plan {
    build(&request(env), inv, DEV_ROOT, image).unwrap_or_else(|e| panic!("{env:?}: {e}"))
}

fn plan(env: &[&str]) -> Plan {
    plan_on(&standard(), env, DEBIAN)
}

fn plan_err(inv: &Inventory, env: &[&str]) -> PlanError {
    match build(&request(env), inv, DEV_ROOT, DEBIAN) {
        Ok(p) => panic!("{env:?}: expected an error, got {p:#?}"),
        Err(e) => e,
    }
}

fn visible(value: &str) -> String {
    format!("NVIDIA_VISIBLE_DEVICES={value}")
}

fn caps(value: &str) -> String {
    format!("NVIDIA_DRIVER_CAPABILITIES={value}")
}

fn env_of(vars: &[String]) -> Vec<&str> {
    vars.iter().map(String::as_str).collect()
}

fn ids(plan: &Plan) -> Vec<&str> {
    plan.selected.iter().map(|s| s.id.as_str()).collect()
}

fn device_paths(plan: &Plan) -> Vec<&str> {
    plan.devices.iter().map(|d| d.path.as_str()).collect()
}

fn destinations(plan: &Plan) -> Vec<&str> {
    plan.mounts.iter().map(|m| m.destination.as_str()).collect()
}

fn has_mount(plan: &Plan, destination: &str) -> bool {
    destinations(plan).contains(&destination)
}

fn cap_node(minor: u32) -> String {
    format!("/dev/nvidia-caps/nvidia-cap{minor}")
}

fn gpu_nodes(plan: &Plan) -> Vec<&str> {
    device_paths(plan)
        .into_iter()
        .filter(|p| {
            p.strip_prefix("/dev/nvidia")
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .collect()
}

// ---------------------------------------------------------------- selection

#[test]
fn selects_devices_by_every_id_form() {
    let (gi0, ci0) = cap_minors(3, 0);
    let (gi1, ci1) = cap_minors(3, 1);
    let upper_nvml_bus = bus_id(1).replacen("0000:", "00000000:", 1).to_uppercase();
    // (NVIDIA_VISIBLE_DEVICES, selected ids, GPU nodes, nvidia-caps nodes)
    type Case<'a> = (String, Vec<&'a str>, Vec<&'a str>, Vec<u32>);
    let cases: Vec<Case> = vec![
        ("0".into(), vec!["0"], vec!["/dev/nvidia0"], vec![]),
        (
            "2,0".into(),
            vec!["2", "0"],
            vec!["/dev/nvidia2", "/dev/nvidia0"],
            vec![],
        ),
        (gpu_uuid(2), vec!["2"], vec!["/dev/nvidia2"], vec![]),
        // UUIDs compare case-insensitively, as NVML's do.
        (
            gpu_uuid(2).to_lowercase().replacen("gpu-", "GPU-", 1),
            vec!["2"],
            vec!["/dev/nvidia2"],
            vec![],
        ),
        (bus_id(1), vec!["1"], vec!["/dev/nvidia1"], vec![]),
        // NVML's form: 8-digit domain, upper case.
        (upper_nvml_bus, vec!["1"], vec!["/dev/nvidia1"], vec![]),
        // Domain 0 may be left out.
        ("1b:00.0".into(), vec!["1"], vec!["/dev/nvidia1"], vec![]),
        (
            mig_uuid(3, 1),
            vec!["3:1"],
            vec!["/dev/nvidia3"],
            vec![gi1, ci1],
        ),
        (
            "3:0".into(),
            vec!["3:0"],
            vec!["/dev/nvidia3"],
            vec![gi0, ci0],
        ),
        (
            "3:0,3:1".into(),
            vec!["3:0", "3:1"],
            vec!["/dev/nvidia3"],
            vec![gi0, ci0, gi1, ci1],
        ),
        (
            "all".into(),
            vec!["0", "1", "2", "3", "3:0", "3:1"],
            vec![
                "/dev/nvidia0",
                "/dev/nvidia1",
                "/dev/nvidia2",
                "/dev/nvidia3",
            ],
            vec![gi0, ci0, gi1, ci1],
        ),
        // The same GPU named twice is selected once.
        (
            format!("0,{}", gpu_uuid(0)),
            vec!["0"],
            vec!["/dev/nvidia0"],
            vec![],
        ),
        ("none".into(), vec![], vec![], vec![]),
    ];
    for (value, want_ids, want_gpu_nodes, want_caps) in cases {
        let p = plan(&[&visible(&value)]);
        assert_eq!(ids(&p), want_ids, "{value}");
        assert_eq!(gpu_nodes(&p), want_gpu_nodes, "{value}");
        let cap_nodes: Vec<&str> = device_paths(&p)
            .into_iter()
            .filter(|d| d.starts_with("/dev/nvidia-caps/"))
            .collect();
        let want_caps: Vec<String> = want_caps.into_iter().map(cap_node).collect();
        assert_eq!(cap_nodes, want_caps, "{value}");
        // The control node comes with every GPU request.
        assert_eq!(p.devices[0].path, "/dev/nvidiactl", "{value}");
        for s in &p.selected {
            let gpu_index: u32 = s.id.split(':').next().unwrap().parse().unwrap();
            assert_eq!(s.pci_bus_id, bus_id(gpu_index), "{value}");
        }
    }
}

#[test]
fn selected_records_uuid_and_bus_id() {
    let p = plan(&[&visible("1,3:1")]);
    let got: Vec<(&str, &str, &str)> = p
        .selected
        .iter()
        .map(|s| (s.id.as_str(), s.uuid.as_str(), s.pci_bus_id.as_str()))
        .collect();
    let (u1, m31, b1, b3) = (gpu_uuid(1), mig_uuid(3, 1), bus_id(1), bus_id(3));
    assert_eq!(got, vec![("1", &*u1, &*b1), ("3:1", &*m31, &*b3)]);
}

#[test]
fn void_empty_and_unset_are_not_gpu_requests() {
    for env in [
        vec![],
        vec!["NVIDIA_VISIBLE_DEVICES=void"],
        vec!["NVIDIA_VISIBLE_DEVICES="],
    ] {
        assert_eq!(request_of(&env, &["CAP_CHOWN"]), None, "{env:?}");
    }
}

#[test]
fn none_gives_control_nodes_and_libraries_but_no_gpu() {
    let p = plan(&["NVIDIA_VISIBLE_DEVICES=none"]);
    assert!(p.selected.is_empty());
    assert_eq!(
        device_paths(&p),
        vec!["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    );
    for lib in ["libcuda", "libnvidia-ml"] {
        assert!(
            has_mount(&p, &format!("{DEBIAN_LIB64}/{lib}.so.{VERSION}")),
            "{lib}: {:?}",
            destinations(&p)
        );
    }
    assert!(has_mount(&p, "/usr/bin/nvidia-smi"));
    assert_eq!(p.proc_overlay, None);
}

#[test]
fn mig_management_nodes_for_privileged_containers() {
    let env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_MIG_CONFIG_DEVICES=all"];
    let r = request_of(&env, &["CAP_SYS_ADMIN"]).unwrap();
    let p = build(&r, &standard(), DEV_ROOT, DEBIAN).unwrap();
    let paths = device_paths(&p);
    assert!(
        paths.contains(&cap_node(MIG_CONFIG_MINOR).as_str()),
        "{paths:?}"
    );
    assert!(
        !paths.contains(&cap_node(MIG_MONITOR_MINOR).as_str()),
        "{paths:?}"
    );

    let env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_MIG_MONITOR_DEVICES=all"];
    let r = request_of(&env, &["CAP_SYS_ADMIN"]).unwrap();
    let p = build(&r, &standard(), DEV_ROOT, DEBIAN).unwrap();
    assert!(device_paths(&p).contains(&cap_node(MIG_MONITOR_MINOR).as_str()));
}

#[test]
fn proc_overlay_lists_each_selected_gpu_once() {
    let cases: [(&str, Vec<String>); 4] = [
        ("0", vec![bus_id(0)]),
        ("3:0,3:1", vec![bus_id(3)]),
        // MIG devices of one GPU around another GPU: still one directory per GPU, else
        // the overlay would try to create gpus/<bus> twice.
        ("3:0,0,3:1", vec![bus_id(3), bus_id(0)]),
        ("all", (0..4).map(bus_id).collect()),
    ];
    for (value, want) in cases {
        let p = plan(&[&visible(value)]);
        let overlay = p
            .proc_overlay
            .unwrap_or_else(|| panic!("{value}: no overlay"));
        assert_eq!(overlay.host_dir, Path::new("/node/proc/driver/nvidia"));
        assert_eq!(overlay.gpus, want, "{value}");
    }
    let mut inv = standard();
    inv.proc_driver = None;
    assert_eq!(plan_on(&inv, &[&visible("0")], DEBIAN).proc_overlay, None);
}

// ---------------------------------------------------------------- capabilities

#[test]
fn capabilities_choose_files_and_nodes() {
    let lib = |stem: &str| format!("{DEBIAN_LIB64}/{stem}.so.{VERSION}");
    let lib32 = |stem: &str| format!("{DEBIAN_LIB32}/{stem}.so.{VERSION}");
    let smi = "/usr/bin/nvidia-smi".to_string();
    let mps = "/usr/bin/nvidia-cuda-mps-control".to_string();
    let socket = "/run/nvidia-persistenced/socket".to_string();
    let icd = "/etc/vulkan/icd.d/nvidia_icd.json".to_string();
    let (uvm, modeset) = ("/dev/nvidia-uvm", "/dev/nvidia-modeset");
    // (capabilities, mounts wanted, mounts not wanted, nodes wanted, nodes not wanted)
    type Case<'a> = (
        &'a str,
        Vec<String>,
        Vec<String>,
        Vec<&'a str>,
        Vec<&'a str>,
    );
    let cases: Vec<Case> = vec![
        (
            "utility",
            vec![smi.clone(), lib("libnvidia-ml"), socket.clone()],
            vec![lib("libcuda"), mps.clone(), lib32("libnvidia-ml")],
            vec![],
            vec![uvm, "/dev/nvidia-uvm-tools", modeset],
        ),
        (
            "compute",
            vec![lib("libcuda"), lib("libnvidia-ptxjitcompiler"), mps.clone()],
            vec![smi.clone(), lib("libnvidia-ml"), lib32("libcuda")],
            vec![uvm, "/dev/nvidia-uvm-tools"],
            vec![modeset],
        ),
        (
            // The default: utility and compute.
            "",
            vec![lib("libcuda"), lib("libnvidia-ml"), smi.clone()],
            vec![lib32("libcuda"), lib("libnvcuvid"), icd.clone()],
            vec![uvm],
            vec![modeset],
        ),
        (
            "compute,compat32",
            vec![
                lib("libcuda"),
                lib32("libcuda"),
                lib32("libnvidia-ptxjitcompiler"),
            ],
            // compat32 adds 32-bit copies of the requested capabilities only.
            vec![lib32("libnvidia-ml")],
            vec![uvm],
            vec![],
        ),
        (
            "utility,compat32",
            vec![lib("libnvidia-ml"), lib32("libnvidia-ml")],
            vec![lib32("libcuda")],
            vec![],
            vec![uvm],
        ),
        (
            "video",
            vec![lib("libnvcuvid")],
            vec![lib("libcuda"), smi.clone()],
            vec![],
            vec![uvm, modeset],
        ),
        (
            "graphics",
            vec![lib("libGLX_nvidia"), lib("libnvidia-glcore"), icd.clone()],
            vec![lib("libcuda")],
            vec![],
            vec![modeset],
        ),
        (
            "display",
            vec![lib("libGLX_nvidia")],
            vec![lib("libcuda")],
            vec![modeset],
            vec![uvm],
        ),
        (
            "ngx",
            vec![lib("libnvidia-ngx")],
            vec![lib("libcuda")],
            vec![],
            vec![],
        ),
        (
            "all",
            vec![
                lib("libcuda"),
                lib32("libcuda"),
                lib("libnvidia-ngx"),
                icd,
                smi,
            ],
            vec![],
            vec![uvm, modeset],
            vec![],
        ),
    ];
    for (value, want, not_want, nodes, not_nodes) in cases {
        let p = plan(&[&visible("0"), &caps(value)]);
        let dests = destinations(&p);
        for w in &want {
            assert!(dests.contains(&w.as_str()), "{value}: no {w} in {dests:#?}");
        }
        for w in &not_want {
            assert!(!dests.contains(&w.as_str()), "{value}: unexpected {w}");
        }
        let paths = device_paths(&p);
        for n in nodes {
            assert!(paths.contains(&n), "{value}: no {n} in {paths:?}");
        }
        for n in not_nodes {
            assert!(!paths.contains(&n), "{value}: unexpected {n}");
        }
        if !value.contains("compat32") && value != "all" {
            assert!(
                !dests.iter().any(|d| d.starts_with(DEBIAN_LIB32)),
                "{value}: 32-bit library without compat32: {dests:#?}"
            );
        }
    }
}

#[test]
fn libcuda_gets_soname_and_development_symlinks() {
    let p = plan(&[&visible("0"), &caps("compute")]);
    let links: Vec<(&str, &str)> = p
        .symlinks
        .iter()
        .map(|l| (l.path.as_str(), l.target.as_str()))
        .collect();
    let real = format!("libcuda.so.{VERSION}");
    let soname_link = format!("{DEBIAN_LIB64}/libcuda.so.1");
    let dev_link = format!("{DEBIAN_LIB64}/libcuda.so");
    assert!(links.contains(&(&soname_link, &real)), "{links:?}");
    assert!(links.contains(&(&dev_link, "libcuda.so.1")), "{links:?}");
    // Every symlink is relative, in its own directory.
    assert!(
        p.symlinks.iter().all(|l| !l.target.contains('/')),
        "{links:?}"
    );
}

/// The other names NVIDIA's specs give these libraries, which images built for its toolkit
/// look up.
#[test]
fn libraries_get_the_other_names_nvidias_toolkit_gives_them() {
    let p = plan(&[&visible("0"), &caps("video,graphics")]);
    let links: Vec<(&str, &str)> = p
        .symlinks
        .iter()
        .map(|l| (l.path.as_str(), l.target.as_str()))
        .collect();
    for (name, target) in [
        (
            "libnvidia-opticalflow.so",
            "libnvidia-opticalflow.so.1".into(),
        ),
        (
            "libnvidia-vulkan-producer.so",
            format!("libnvidia-vulkan-producer.so.{VERSION}"),
        ),
        (
            "libGLX_indirect.so.0",
            format!("libGLX_nvidia.so.{VERSION}"),
        ),
    ] {
        let path = format!("{DEBIAN_LIB64}/{name}");
        assert!(links.contains(&(&path, &target)), "{name}: {links:?}");
    }
    // Not without their capability.
    let p = plan(&[&visible("0"), &caps("compute")]);
    assert!(
        !p.symlinks
            .iter()
            .any(|l| l.path.ends_with("/libGLX_indirect.so.0")),
        "{:?}",
        p.symlinks
    );
}

#[test]
fn library_whose_soname_is_its_file_name_has_no_symlink() {
    let p = plan(&[&visible("0"), &caps("graphics")]);
    let glcore = format!("libnvidia-glcore.so.{VERSION}");
    assert!(has_mount(&p, &format!("{DEBIAN_LIB64}/{glcore}")));
    assert!(
        !p.symlinks.iter().any(|l| l.path.ends_with(&glcore)),
        "{:?}",
        p.symlinks
    );
    assert!(
        p.ldcache.iter().any(|e| e.soname == glcore),
        "{:?}",
        p.ldcache
    );
}

#[test]
fn mounts_come_from_the_driver_root() {
    let p = plan(&[&visible("all"), &caps("all")]);
    for m in &p.mounts {
        assert!(m.source.starts_with("/drv"), "{m:?}");
        assert!(m.destination.starts_with('/'), "{m:?}");
    }
    let sources: BTreeSet<&Path> = p.mounts.iter().map(|m| m.source.as_path()).collect();
    assert_eq!(sources.len(), p.mounts.len(), "a source mounted twice");
}

#[test]
fn a_host_file_found_under_two_names_is_mounted_once() {
    // The driver root's /var/run is a link to /run: the socket's lookups under both names end
    // at the same host file, and the container gets it once, at the first name.
    let mut inv = standard();
    let socket = inv.files.sockets[0].clone();
    inv.files.sockets.push(HostFile {
        container_path: "/var/run/nvidia-persistenced/socket".into(),
        ..socket.clone()
    });
    let p = plan_on(&inv, &[&visible("0"), &caps("utility")], DEBIAN);
    let at_socket: Vec<&str> = p
        .mounts
        .iter()
        .filter(|m| m.source == socket.host_path)
        .map(|m| m.destination.as_str())
        .collect();
    assert_eq!(at_socket, [socket.container_path.as_str()]);
}

#[test]
fn firmware_only_when_a_gpu_is_selected() {
    for (value, want) in [("0", true), ("3:1", true), ("all", true), ("none", false)] {
        let p = plan(&[&visible(value)]);
        assert_eq!(has_mount(&p, FIRMWARE), want, "{value}");
    }
}

#[test]
fn capability_without_its_key_library_is_an_error() {
    let cases = [
        (Capability::Utility, "libnvidia-ml.so.1"),
        (Capability::Compute, "libcuda.so.1"),
    ];
    for (capability, soname) in cases {
        // Only the key library missing: the capability's other files do not make up for it.
        let mut inv = standard();
        inv.files.libraries.retain(|l| l.soname != soname);
        let e = plan_err(&inv, &[&visible("0"), &caps(capability.name())]);
        assert_eq!(e, PlanError::MissingLibrary { capability, soname });
        assert!(e.to_string().contains(capability.name()), "{e}");
        // Nothing of the capability at all.
        let files = &mut inv.files;
        files.libraries.retain(|l| l.capability != capability);
        files.binaries.retain(|f| f.capability != Some(capability));
        files.sockets.retain(|f| f.capability != Some(capability));
        let e = plan_err(&inv, &[&visible("0"), &caps(capability.name())]);
        assert_eq!(e, PlanError::MissingLibrary { capability, soname });
    }
}

// ---------------------------------------------------------------- layout

#[test]
fn layout_follows_the_image() {
    let image = |debian, has_usr_lib64, has_ldcache| ImageInfo {
        debian,
        has_usr_lib64,
        has_ldcache,
        cuda_compat: None,
    };
    // (image, 64-bit dir, 32-bit dir, ld.so.conf.d dirs with compat32)
    let cases = [
        (
            image(true, false, true),
            DEBIAN_LIB64,
            DEBIAN_LIB32,
            Some(vec![DEBIAN_LIB64, DEBIAN_LIB32]),
        ),
        // Debian wins over a /usr/lib64 that some Debian images also have.
        (
            image(true, true, true),
            DEBIAN_LIB64,
            DEBIAN_LIB32,
            Some(vec![DEBIAN_LIB64, DEBIAN_LIB32]),
        ),
        (image(false, true, true), "/usr/lib64", "/usr/lib", None),
        (
            image(false, false, true),
            "/usr/lib",
            "/usr/lib32",
            Some(vec!["/usr/lib32"]),
        ),
        // No loader cache (musl, static): nothing to configure.
        (image(true, false, false), DEBIAN_LIB64, DEBIAN_LIB32, None),
        (image(false, false, false), "/usr/lib", "/usr/lib32", None),
    ];
    for (info, lib64, lib32, conf_dirs) in cases {
        let p = plan_on(
            &standard(),
            &[&visible("0"), &caps("compute,utility,compat32")],
            info.clone(),
        );
        assert_eq!(p.layout.lib64_dir, lib64, "{info:?}");
        assert_eq!(p.layout.lib32_dir, lib32, "{info:?}");
        assert_eq!(p.layout.ldcache, info.has_ldcache, "{info:?}");
        for (dir, stem) in [
            (lib64, "libcuda"),
            (lib32, "libcuda"),
            (lib64, "libnvidia-ml"),
        ] {
            let want = format!("{dir}/{stem}.so.{VERSION}");
            assert!(has_mount(&p, &want), "{info:?}: no {want}");
        }
        let conf = p.ld_so_confs.first();
        assert_eq!(
            conf.map(|c| c.dirs.iter().map(String::as_str).collect::<Vec<_>>()),
            conf_dirs,
            "{info:?}"
        );
        if let Some(c) = conf {
            assert!(c.path.starts_with("/etc/ld.so.conf.d/"), "{c:?}");
            assert!(c.path.ends_with(".conf"), "{c:?}");
        }
    }
}

/// A static spec's libraries at host paths: an image without a loader cache needs one where
/// they lie outside the directory its loader is known to search.
#[test]
fn an_image_without_a_cache_needs_one_for_libraries_outside_its_loaders_path() {
    let image = |debian, has_usr_lib64, has_ldcache| ImageInfo {
        debian,
        has_usr_lib64,
        has_ldcache,
        cuda_compat: None,
    };
    let entry = |path: &str, class| CacheEntry {
        soname: "libcuda.so.1".into(),
        path: path.into(),
        class,
    };
    let gke = [entry(
        "/usr/local/nvidia/lib64/libcuda.so.1",
        ElfClass::Lib64,
    )];
    let debian_host = [
        entry(&format!("{DEBIAN_LIB64}/libcuda.so.1"), ElfClass::Lib64),
        entry(&format!("{DEBIAN_LIB32}/libcuda.so.1"), ElfClass::Lib32),
    ];
    let fedora_host = [entry("/usr/lib64/libcuda.so.1", ElfClass::Lib64)];
    let x86 = Arch::X86_64;
    // (image, entries, needs a cache)
    let cases: [(ImageInfo, &[CacheEntry], bool); 8] = [
        (image(true, false, false), &gke, true),
        (image(false, false, false), &gke, true),
        (image(true, false, false), &debian_host, false),
        (image(false, true, false), &fedora_host, false),
        (image(false, true, false), &debian_host, true),
        (image(true, false, false), &fedora_host, true),
        // An image with a cache gets the entries added to it: never a second one.
        (image(false, false, true), &gke, false),
        (image(false, false, false), &[], false),
    ];
    for (info, entries, needed) in cases {
        assert_eq!(
            info.needs_cache_for(x86, entries),
            needed,
            "{info:?} {entries:?}"
        );
    }
}

#[test]
fn ldcache_entries_point_at_the_sonames_in_the_layout() {
    let p = plan(&[&visible("0"), &caps("compute,utility,compat32")]);
    let entry = |soname: &str, class: ElfClass| {
        p.ldcache
            .iter()
            .find(|e| e.soname == soname && e.class == class)
            .map(|e| e.path.clone())
    };
    assert_eq!(
        entry("libcuda.so.1", ElfClass::Lib64),
        Some(format!("{DEBIAN_LIB64}/libcuda.so.1"))
    );
    assert_eq!(
        entry("libcuda.so.1", ElfClass::Lib32),
        Some(format!("{DEBIAN_LIB32}/libcuda.so.1"))
    );
    assert_eq!(
        entry("libnvidia-ml.so.1", ElfClass::Lib64),
        Some(format!("{DEBIAN_LIB64}/libnvidia-ml.so.1"))
    );
    // Every cache entry names a mounted file or one of the plan's symlinks.
    for e in &p.ldcache {
        let provided = has_mount(&p, &e.path) || p.symlinks.iter().any(|l| l.path == e.path);
        assert!(provided, "{e:?} points at nothing");
    }
}

// ---------------------------------------------------------------- aarch64

const ARM_HOST_LIB64: &str = "/drv/usr/lib/aarch64-linux-gnu";
const ARM_DEBIAN_LIB64: &str = "/usr/lib/aarch64-linux-gnu";

/// The standard node as an arm64 one (Grace Hopper, Grace Blackwell): its driver libraries in
/// Debian's aarch64 directory, and no 32-bit copies (the arm64 driver has none).
fn arm64_node() -> Inventory {
    let mut inv = standard();
    inv.arch = Arch::Aarch64;
    inv.files.libraries.retain(|l| l.class == ElfClass::Lib64);
    for lib in &mut inv.files.libraries {
        lib.host_path = Path::new(ARM_HOST_LIB64).join(&lib.file_name);
    }
    inv
}

#[test]
fn an_arm64_node_mounts_its_libraries_in_the_images_aarch64_directories() {
    let inv = arm64_node();
    let env = [visible("0"), caps("compute,utility")];
    let p = plan_on(&inv, &env_of(&env), DEBIAN);
    assert_eq!(p.layout.arch, Arch::Aarch64);
    assert_eq!(p.layout.lib64_dir, ARM_DEBIAN_LIB64);
    let cuda = format!("{ARM_DEBIAN_LIB64}/libcuda.so.{VERSION}");
    let mount = p.mounts.iter().find(|m| m.destination == cuda).unwrap();
    assert_eq!(
        mount.source,
        Path::new(ARM_HOST_LIB64).join(format!("libcuda.so.{VERSION}"))
    );
    assert!(
        p.symlinks
            .iter()
            .any(|l| l.path == format!("{ARM_DEBIAN_LIB64}/libcuda.so.1"))
    );
    assert!(!p.mounts.iter().any(|m| m.destination.contains("x86_64")));
    for e in &p.ldcache {
        assert_eq!(e.class, ElfClass::Lib64, "{e:?}");
        assert!(e.path.starts_with(ARM_DEBIAN_LIB64), "{e:?}");
    }
    assert_eq!(
        p.ld_so_confs[0].dirs,
        [ARM_DEBIAN_LIB64],
        "{:?}",
        p.ld_so_confs
    );
    // Fedora, RHEL and SUSE use /usr/lib64 on arm64 too.
    let rpm = ImageInfo {
        debian: false,
        has_usr_lib64: true,
        ..DEBIAN
    };
    let p = plan_on(&inv, &env_of(&env), rpm);
    assert_eq!(p.layout.lib64_dir, "/usr/lib64");
    assert!(has_mount(&p, &format!("/usr/lib64/libcuda.so.{VERSION}")));
    // The plan carries the architecture to the hook, which writes the cache's flags by it.
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["layout"]["arch"], "aarch64");
    assert_eq!(serde_json::from_value::<Plan>(json).unwrap(), p);
}

#[test]
fn compat32_on_an_arm64_node_is_skipped_not_a_failed_start() {
    let inv = arm64_node();
    for value in ["compute,utility,compat32", "all"] {
        let env = [visible("0"), caps(value)];
        let p = plan_on(&inv, &env_of(&env), DEBIAN);
        assert_eq!(
            p.skipped,
            [Skipped {
                what: "capability compat32".into(),
                why: "the NVIDIA driver for aarch64 has no 32-bit libraries; the 64-bit ones are mounted".into(),
            }],
            "{value}"
        );
        assert!(has_mount(
            &p,
            &format!("{ARM_DEBIAN_LIB64}/libcuda.so.{VERSION}")
        ));
        assert!(
            p.ldcache.iter().all(|e| e.class == ElfClass::Lib64),
            "{value}"
        );
        assert!(
            !destinations(&p).iter().any(|d| d.contains("arm-linux")),
            "{value}"
        );
    }
    // Even a 32-bit library in the host's cache (an armhf copy) stays out.
    let mut armhf = arm64_node();
    armhf.files.libraries.extend(
        library(
            Capability::Compute,
            "libcuda.so.1",
            &format!("libcuda.so.{VERSION}"),
            true,
        )
        .into_iter()
        .filter(|l| l.class == ElfClass::Lib32),
    );
    let env = [visible("0"), caps("compute,utility,compat32")];
    let p = plan_on(&armhf, &env_of(&env), DEBIAN);
    assert!(p.ldcache.iter().all(|e| e.class == ElfClass::Lib64));
    assert_eq!(p.skipped.len(), 1);
    // x86_64 has it, and skips nothing.
    let p = plan_on(&standard(), &env_of(&env), DEBIAN);
    assert!(p.skipped.is_empty());
    assert!(p.ldcache.iter().any(|e| e.class == ElfClass::Lib32));
}

#[test]
fn layouts_name_each_architectures_debian_directories() {
    let layout = |arch| Layout::for_image(&DEBIAN, arch);
    assert_eq!(layout(Arch::X86_64).lib64_dir, DEBIAN_LIB64);
    assert_eq!(layout(Arch::X86_64).lib32_dir, DEBIAN_LIB32);
    assert_eq!(layout(Arch::Aarch64).lib64_dir, ARM_DEBIAN_LIB64);
    assert_eq!(
        layout(Arch::Aarch64).lib32_dir,
        "/usr/lib/arm-linux-gnueabihf"
    );
    // A plan written before the field existed is the build target's.
    let mut json = serde_json::to_value(layout(Arch::HOST)).unwrap();
    json.as_object_mut().unwrap().remove("arch");
    assert_eq!(
        serde_json::from_value::<Layout>(json).unwrap(),
        layout(Arch::HOST)
    );
}

// ---------------------------------------------------------------- errors

#[test]
fn absent_gpu_names_the_value_and_what_the_node_has() {
    let e = plan_err(&inventory(4, &[]), &[&visible("7")]);
    assert_eq!(
        e.to_string(),
        "NVIDIA_VISIBLE_DEVICES=7: no such GPU (this node has 0-3)"
    );
    let cases = [
        ("7", "7"),
        ("0,7", "7"),
        ("3:2", "3:2"),
        ("0:0", "0:0"),
        ("GPU-99999999-1111-2222-3333-444455556666", "GPU-99999999"),
        ("MIG-99999999-aaaa-bbbb-cccc-ddddeeeeffff", "MIG-99999999"),
        ("0000:99:00.0", "0000:99:00.0"),
    ];
    for (value, named) in cases {
        let e = plan_err(&standard(), &[&visible(value)]).to_string();
        assert!(e.starts_with("NVIDIA_VISIBLE_DEVICES="), "{value}: {e}");
        assert!(e.contains(named), "{value}: {e}");
        assert!(e.contains("no such GPU (this node has 0-3"), "{value}: {e}");
        assert!(e.contains("3:0") && e.contains("3:1"), "{value}: {e}");
    }
    let e = plan_err(&inventory(0, &[]), &[&visible("0")]).to_string();
    assert!(e.contains("no such GPU"), "{e}");
}

#[test]
fn unsatisfied_requirement_names_condition_and_host() {
    // (visible devices, requirement, text the message must contain)
    let cases = [
        (
            "0",
            "cuda>=12.6",
            vec!["cuda>=12.6", VERSION, "supports CUDA 12.4"],
        ),
        (
            "none",
            "cuda>=12.6",
            vec!["cuda>=12.6", VERSION, "supports CUDA 12.4"],
        ),
        ("0", "driver>=560", vec!["driver>=560", VERSION]),
        (
            "3:1",
            "arch>=9.0",
            vec!["arch>=9.0", "compute capability 8.0"],
        ),
        ("0", "brand=geforce", vec!["brand=geforce", "brand tesla"]),
    ];
    for (value, requirement, named) in cases {
        let e = plan_err(
            &standard(),
            &[
                &visible(value),
                &format!("NVIDIA_REQUIRE_CUDA={requirement}"),
            ],
        )
        .to_string();
        assert!(
            e.starts_with(&format!("unsatisfied condition: {requirement} (")),
            "{e}"
        );
        for n in named {
            assert!(e.contains(n), "{requirement}: {n:?} not in {e}");
        }
        assert!(!e.contains('\n'), "{e}");
    }
}

/// SECURITY.md's promise, for the values the plan echoes: a 100,000-byte one still gives one
/// line of at most 400 characters, as the hook prints it.
#[test]
fn container_values_in_plan_errors_are_cut() {
    const HUGE: usize = 100_000;
    let uuid = format!("GPU-{}", "a".repeat(HUGE - 4));
    // Every other channel, so that no run shortens the list.
    let mut channels = String::from("0");
    let mut c = 0;
    while channels.len() < HUGE {
        c += 2;
        channels.push_str(&format!(",{c}"));
    }
    let condition = format!("cuda>=99{}", ".1".repeat(HUGE / 2));
    let cases = [
        (vec![visible(&uuid)], "NVIDIA_VISIBLE_DEVICES=GPU-aaaa"),
        (
            vec![visible("0"), format!("NVIDIA_IMEX_CHANNELS={channels}")],
            "NVIDIA_IMEX_CHANNELS=0,2,4,6",
        ),
        (
            vec![visible("0"), format!("NVIDIA_REQUIRE_CUDA={condition}")],
            "unsatisfied condition: cuda>=99.1.1.1",
        ),
    ];
    for (env, start) in cases {
        let e = plan_err(&standard(), &env_of(&env));
        let line = format!("nvhook: {e}");
        assert!(line.len() <= 400 && !line.contains('\n'), "{line}");
        assert!(line.starts_with(&format!("nvhook: {start}")), "{line}");
        assert!(line.contains(" bytes)"), "{line}");
    }
}

#[test]
fn satisfied_requirements_pass() {
    for (value, requirement) in [
        ("0", "cuda>=12.4"),
        // A comma joins conditions (AND), whitespace separates alternatives (OR).
        ("0", "cuda>=12.0,brand=tesla"),
        ("0", "brand=geforce brand=tesla"),
        ("0", "cuda>=12.6 brand=tesla,driver>=550"),
        ("all", "arch>=8.0"),
        // A GPU fact cannot fail a request for no GPU.
        ("none", "arch>=9.0"),
    ] {
        let env = [visible(value), format!("NVIDIA_REQUIRE_CUDA={requirement}")];
        plan(&env_of(&env));
    }
    // NVIDIA_DISABLE_REQUIRE turns the check off.
    plan(&[
        &visible("0"),
        "NVIDIA_REQUIRE_CUDA=cuda>=99.0",
        "NVIDIA_DISABLE_REQUIRE=true",
    ]);
}

#[test]
fn missing_or_wrong_device_node_is_an_error() {
    let remove = |path: &str| {
        let mut inv = standard();
        inv.nodes.retain(|n| n.path != path);
        inv
    };
    let wrong_major = {
        let mut inv = standard();
        for n in inv.nodes.iter_mut().filter(|n| n.path == "/dev/nvidia1") {
            n.major = 196;
        }
        inv
    };
    let (gi, _) = cap_minors(3, 0);
    let cases = [
        (remove("/dev/nvidia1"), "1", "/dev/nvidia1", NVIDIA, 1),
        (wrong_major, "1", "/dev/nvidia1", NVIDIA, 1),
        (
            remove("/dev/nvidiactl"),
            "none",
            "/dev/nvidiactl",
            NVIDIA,
            NVIDIACTL_MINOR,
        ),
        (remove("/dev/nvidia-uvm"), "0", "/dev/nvidia-uvm", UVM, 0),
        (remove(&cap_node(gi)), "3:0", &cap_node(gi), CAPS, gi),
    ];
    for (inv, value, path, major, minor) in cases {
        let e = plan_err(&inv, &[&visible(value)]);
        assert_eq!(
            e,
            PlanError::MissingNode {
                path: path.to_string(),
                dev_root: DEV_ROOT.into(),
                major,
                minor,
            },
            "{value}"
        );
        let text = e.to_string();
        assert!(text.contains(path) && text.contains(DEV_ROOT), "{text}");
        assert!(text.contains(&format!("{major}:{minor}")), "{text}");
    }
    // A node the request does not need may be missing.
    plan_on(&remove("/dev/nvidia1"), &[&visible("0")], DEBIAN);
    plan_on(
        &remove("/dev/nvidia-uvm"),
        &[&visible("0"), &caps("utility")],
        DEBIAN,
    );
}

#[test]
fn headless_host_serves_all_capabilities_without_a_modeset_node() {
    // An H100 host with driver 580 has no /dev/nvidia-modeset; CUDA images ask for `all`.
    let mut headless = standard();
    headless.nodes.retain(|n| n.path != "/dev/nvidia-modeset");
    let p = plan_on(&headless, &[&visible("0"), &caps("all")], DEBIAN);
    assert!(device_paths(&p).contains(&"/dev/nvidia0"), "{p:?}");
    assert!(!device_paths(&p).contains(&"/dev/nvidia-modeset"), "{p:?}");
    let with_display = plan(&[&visible("0"), &caps("all")]);
    assert!(device_paths(&with_display).contains(&"/dev/nvidia-modeset"));
}

#[test]
fn a_file_with_two_sonames_gets_a_link_and_cache_entry_for_each() {
    let mut inv = standard();
    let real = format!("libcuda.so.{VERSION}");
    // Sorted before `libcuda.so.1`, as the inventory sorts by name.
    let mut extra = library(Capability::Compute, "libcuda.so.0", &real, false);
    extra.append(&mut inv.files.libraries);
    inv.files.libraries = extra;
    let p = plan_on(&inv, &[&visible("0"), &caps("compute")], DEBIAN);
    for soname in ["libcuda.so.0", "libcuda.so.1"] {
        let link = format!("{DEBIAN_LIB64}/{soname}");
        assert!(p.symlinks.iter().any(|l| l.path == link), "{soname}");
        assert!(p.ldcache.iter().any(|e| e.soname == soname), "{soname}");
    }
    let destination = format!("{DEBIAN_LIB64}/{real}");
    let mounted = p.mounts.iter().filter(|m| m.destination == destination);
    assert_eq!(mounted.count(), 1);
}

#[test]
fn driver_without_uvm_or_caps_fails_requests_that_need_them() {
    let mut no_uvm = standard();
    no_uvm.majors.uvm = None;
    let e = plan_err(&no_uvm, &[&visible("0"), &caps("compute")]).to_string();
    assert!(e.contains("/dev/nvidia-uvm"), "{e}");
    plan_on(&no_uvm, &[&visible("0"), &caps("utility")], DEBIAN);

    let mut no_caps = standard();
    no_caps.majors.caps = None;
    let e = plan_err(&no_caps, &[&visible("3:0")]);
    assert!(matches!(e, PlanError::NoCapsMajor { .. }), "{e:?}");
    assert!(e.to_string().contains(&mig_uuid(3, 0)), "{e}");
    plan_on(&no_caps, &[&visible("3")], DEBIAN);
}

// ---------------------------------------------------------------- whole plans

/// Requests covering every branch the plan has, for the properties below.
fn sample_plans() -> Vec<Plan> {
    let values = ["0", "1,2", "3:0", "3:0,3:1", "all", "none"];
    let capabilities = ["", "utility", "compute,compat32", "display", "all"];
    let mut out = Vec::new();
    for value in values {
        for c in capabilities {
            out.push(plan(&[&visible(value), &caps(c)]));
        }
    }
    out
}

#[test]
fn cgroup_rules_match_device_nodes_one_to_one() {
    for p in sample_plans() {
        let want: Vec<DeviceRule> = p
            .devices
            .iter()
            .map(|d| DeviceRule::char_rw(d.major, d.minor))
            .collect();
        assert_eq!(p.cgroup_rules, want, "{:?}", ids(&p));
        let unique: BTreeSet<&str> = device_paths(&p).into_iter().collect();
        assert_eq!(unique.len(), p.devices.len(), "{:?}", device_paths(&p));
        // Every node is the host's, under the dev root.
        for d in &p.devices {
            assert!(d.host_path.starts_with(DEV_ROOT), "{d:?}");
        }
    }
}

#[test]
fn every_plan_round_trips_through_json() {
    for p in sample_plans() {
        let text = serde_json::to_string(&p).expect("serialise");
        let back: Plan = serde_json::from_str(&text).expect("deserialise");
        assert_eq!(back, p);
    }
}

#[test]
fn plan_reports_the_driver_version() {
    assert_eq!(plan(&[&visible("0")]).driver_version, VERSION);
}

#[test]
fn the_hook_makes_only_the_nodes_the_spec_does_not_list() {
    let plan = two_node_plan();
    let (nodes, rules) = plan.left_to_hook([]);
    assert_eq!(nodes.len(), 2);
    assert_eq!(rules.len(), 2);
    // nvhook-runtime listed /dev/nvidia0: the runtime makes it and owns its rule.
    let listed = [(Path::new("/dev/nvidia0"), Some(195), Some(0))];
    let (nodes, rules) = plan.left_to_hook(listed);
    assert_eq!(nodes, [&plan.devices[1]]);
    assert_eq!(rules, [DeviceRule::char_rw(195, 255)]);
    // A listed path with other numbers is not the same node: the hook still makes ours.
    let other = [(Path::new("/dev/nvidia0"), Some(195), Some(7))];
    assert_eq!(plan.left_to_hook(other).0.len(), 2);
}

// ---------------------------------------------------------------- CUDA compat

fn with_compat(files: &[&str]) -> ImageInfo {
    ImageInfo {
        cuda_compat: Some(CompatDir {
            dir: "/usr/local/cuda/compat".into(),
            files: files.iter().map(|f| f.to_string()).collect(),
        }),
        ..DEBIAN
    }
}

#[test]
fn a_newer_compat_libcuda_is_what_the_loader_cache_names() {
    let p = plan_on(
        &standard(),
        &[&visible("0"), &caps("compute,utility,compat32")],
        with_compat(&["libcuda.so.580.95.05", "libcuda.so.1"]),
    );
    let compat = p.cuda_compat.as_ref().unwrap();
    assert!(compat.used(), "{compat:?}");
    assert_eq!(compat.libraries, ["libcuda.so.1"]);
    let lib64: Vec<&CacheEntry> = p
        .ldcache
        .iter()
        .filter(|e| e.soname == "libcuda.so.1")
        .collect();
    // One 64-bit entry, into the compat directory; the 32-bit one stays the host's.
    assert_eq!(lib64.len(), 2, "{lib64:?}");
    assert_eq!(lib64[0].path, "/usr/local/cuda/compat/libcuda.so.580.95.05");
    assert_eq!(lib64[1].path, format!("{DEBIAN_LIB32}/libcuda.so.1"));
    // Nothing is written in the image's compat directory.
    assert!(
        !p.symlinks
            .iter()
            .any(|l| l.path.starts_with("/usr/local/cuda/compat/")),
        "{:?}",
        p.symlinks
    );
    // The host's library is still given, where it always goes.
    assert!(has_mount(
        &p,
        &format!("{DEBIAN_LIB64}/libcuda.so.{VERSION}")
    ));
    assert_eq!(p.ld_so_confs[0].path, compat::COMPAT_CONF);
    assert_eq!(p.ld_so_confs[0].dirs, ["/usr/local/cuda/compat"]);
    assert_eq!(p.ld_so_confs.len(), 2);
    let text = crate::plan::text::plan_text(&p);
    assert!(
        text.contains(&format!(
            "CUDA compat: compat 580.95.05 is newer than host driver {VERSION}: the compat libraries in /usr/local/cuda/compat"
        )),
        "{text}"
    );
    let back: Plan = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
}

#[test]
fn an_older_compat_libcuda_leaves_the_plan_as_it_was() {
    let env = [visible("0"), caps("compute,utility")];
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    let plain = plan_on(&standard(), &env, DEBIAN);
    let p = plan_on(&standard(), &env, with_compat(&["libcuda.so.470.256.02"]));
    let compat = p.cuda_compat.clone().unwrap();
    assert!(!compat.used());
    assert_eq!(compat.compat_driver.as_deref(), Some("470.256.02"));
    assert_eq!(
        Plan {
            cuda_compat: None,
            ..p.clone()
        },
        plain
    );
    let text = crate::plan::text::plan_text(&p);
    assert!(
        text.contains("is the same or newer than compat 470.256.02"),
        "{text}"
    );
}

/// [`standard`] with what a desktop driver adds: DRM nodes for GPUs 0 and 1, GBM's allocator,
/// Xorg's modules, and a Vulkan ICD that names its library by absolute path.
fn with_display_stack() -> Inventory {
    use crate::inventory::ConfigLibraryPath;
    use crate::inventory::DrmNode;
    let mut inv = standard();
    for gpu in [0u32, 1] {
        for (name, minor) in [
            (format!("card{gpu}"), gpu),
            (format!("renderD{}", 128 + gpu), 128 + gpu),
        ] {
            inv.drm_nodes.push(DrmNode {
                pci_bus_id: bus_id(gpu),
                node: node(&format!("/dev/dri/{name}"), 226, minor),
            });
        }
    }
    let allocator = format!("libnvidia-allocator.so.{VERSION}");
    for cap in [Capability::Compute, Capability::Graphics] {
        inv.files
            .libraries
            .extend(library(cap, "libnvidia-allocator.so.1", &allocator, false));
    }
    inv.files.xorg_modules = vec![
        host_file(
            Some(Capability::Graphics),
            "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
        ),
        host_file(
            Some(Capability::Graphics),
            &format!("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{VERSION}"),
        ),
    ];
    inv.files.config_library_paths = vec![ConfigLibraryPath {
        config: "/etc/vulkan/icd.d/nvidia_icd.json".into(),
        library_path: "/usr/local/nvidia/lib64/libGLX_nvidia.so.0".into(),
    }];
    inv
}

#[test]
fn graphics_brings_the_gpus_drm_nodes_gbm_xorg_and_config_libraries() {
    let inv = with_display_stack();
    let p = plan_on(&inv, &[&visible("1"), &caps("graphics,display")], DEBIAN);
    let devices = device_paths(&p);
    for path in ["/dev/dri/card1", "/dev/dri/renderD129", "/dev/nvidia1"] {
        assert!(devices.contains(&path), "{path}: {devices:?}");
    }
    // Only the selected GPU's DRM nodes, each with its cgroup rule.
    assert!(!devices.contains(&"/dev/dri/card0"), "{devices:?}");
    assert!(p.cgroup_rules.contains(&DeviceRule::char_rw(226, 129)));
    assert!(!p.cgroup_rules.contains(&DeviceRule::char_rw(226, 128)));

    let links: Vec<(&str, &str)> = p
        .symlinks
        .iter()
        .map(|l| (l.path.as_str(), l.target.as_str()))
        .collect();
    let glx_server = format!("libglxserver_nvidia.so.{VERSION}");
    let gbm = format!("{DEBIAN_LIB64}/gbm/nvidia-drm_gbm.so");
    assert!(
        links.contains(&(gbm.as_str(), "../libnvidia-allocator.so.1")),
        "{links:?}"
    );
    assert!(
        links.contains(&(
            "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so",
            glx_server.as_str()
        )),
        "{links:?}"
    );
    let mounted = |destination: &str| p.mounts.iter().find(|m| m.destination == destination);
    assert!(mounted("/usr/lib/xorg/modules/drivers/nvidia_drv.so").is_some());
    // The ICD's absolute library_path gets the driver's file there too.
    let icd_lib = mounted("/usr/local/nvidia/lib64/libGLX_nvidia.so.0").expect("ICD library");
    assert_eq!(
        icd_lib.source,
        Path::new(HOST_LIB64).join(format!("libGLX_nvidia.so.{VERSION}"))
    );
}

#[test]
fn compute_alone_gets_no_graphics_extras_and_mig_no_drm_nodes() {
    let inv = with_display_stack();
    let p = plan_on(&inv, &[&visible("0"), &caps("compute,utility")], DEBIAN);
    assert!(!device_paths(&p).iter().any(|d| d.starts_with("/dev/dri/")));
    assert!(!p.symlinks.iter().any(|l| l.path.contains("gbm")));
    assert!(!p.mounts.iter().any(|m| m.destination.contains("xorg")));
    assert!(
        !p.mounts
            .iter()
            .any(|m| m.destination.starts_with("/usr/local/nvidia"))
    );
    // The allocator still comes with compute, as before.
    assert!(
        p.ldcache
            .iter()
            .any(|e| e.soname == "libnvidia-allocator.so.1")
    );

    let mig = plan_on(&inv, &[&visible("3:0"), &caps("all")], DEBIAN);
    assert!(
        !device_paths(&mig)
            .iter()
            .any(|d| d.starts_with("/dev/dri/"))
    );
}

#[test]
fn an_at_sonames_plan_mounts_each_library_under_its_soname_in_both_families_dirs() {
    let inv = standard();
    let request = request(&[&visible("1"), &caps("compute,utility,graphics,compat32")]);
    let layout = Layout::at_sonames(inv.arch, DriverDirs::default());
    let plan = build_with_layout(&request, &inv, DEV_ROOT, layout).unwrap();
    for dir in ["/usr/lib/x86_64-linux-gnu", "/usr/lib64"] {
        let at = format!("{dir}/libcuda.so.1");
        let mount = plan.mounts.iter().find(|m| m.destination == at);
        let mount = mount.unwrap_or_else(|| panic!("no {at} in {:?}", destinations(&plan)));
        assert!(mount.source.ends_with("libcuda.so.550.54.15"), "{mount:?}");
        assert!(has_mount(&plan, &format!("{dir}/libnvidia-ml.so.1")));
    }
    // 32-bit copies where each family's 32-bit loader looks.
    for dir in ["/usr/lib/i386-linux-gnu", "/usr/lib"] {
        assert!(has_mount(&plan, &format!("{dir}/libcuda.so.1")), "{dir}");
    }
    // Nothing is left for a hook: no library under a file name that is not its SONAME, no
    // link, no cache.
    assert!(
        !destinations(&plan)
            .iter()
            .any(|d| d.ends_with("libcuda.so.550.54.15"))
    );
    assert!(plan.symlinks.is_empty(), "{:?}", plan.symlinks);
    assert!(plan.ldcache.is_empty() && plan.ld_so_confs.is_empty());
    assert!(has_mount(&plan, "/usr/bin/nvidia-smi"));
    assert!(device_paths(&plan).contains(&"/dev/nvidia1"));
}

/// A CUDA image's environment names the driver's directories: each library goes there once,
/// under its SONAME, and each binary beside them; nothing lands in the image's own
/// directories, and the directories' files are listed for gathering.
#[test]
fn an_at_sonames_plan_uses_the_driver_dirs_the_image_searches() {
    let inv = standard();
    let request = request(&[&visible("1"), &caps("compute,utility,graphics,compat32")]);
    let all = DriverDirs {
        lib64: true,
        lib32: true,
        bin: true,
    };
    let plan =
        build_with_layout(&request, &inv, DEV_ROOT, Layout::at_sonames(inv.arch, all)).unwrap();
    let at_sonames = build_with_layout(
        &request,
        &inv,
        DEV_ROOT,
        Layout::at_sonames(inv.arch, DriverDirs::default()),
    )
    .unwrap();
    let names_in = |plan: &Plan, dir: &str| -> BTreeSet<(String, PathBuf)> {
        plan.mounts
            .iter()
            .filter_map(|m| {
                let (parent, name) = m.destination.rsplit_once('/')?;
                (parent == dir).then(|| (name.to_string(), m.source.clone()))
            })
            .collect()
    };
    // The same files from the same sources, in one directory instead of two.
    let lib64 = names_in(&plan, "/usr/local/nvidia/lib64");
    assert!(!lib64.is_empty());
    assert_eq!(lib64, names_in(&at_sonames, "/usr/lib64"));
    assert_eq!(
        names_in(&plan, "/usr/local/nvidia/lib"),
        names_in(&at_sonames, "/usr/lib/i386-linux-gnu")
    );
    assert_eq!(
        names_in(&plan, "/usr/local/nvidia/bin"),
        names_in(&at_sonames, "/usr/bin")
    );
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/bin",
    ] {
        assert!(names_in(&plan, dir).is_empty(), "{dir}");
    }
    // Every other mount is as before.
    let elsewhere = |plan: &Plan| -> Vec<String> {
        plan.mounts
            .iter()
            .map(|m| m.destination.clone())
            .filter(|d| {
                !d.starts_with("/usr/lib")
                    && !d.starts_with("/usr/bin")
                    && !d.starts_with("/usr/local/nvidia/")
            })
            .collect()
    };
    assert_eq!(elsewhere(&plan), elsewhere(&at_sonames));
    let gathered = crate::plan::driver_dirs::files_by_dir(&plan);
    let dirs: Vec<&str> = gathered.iter().map(|(dir, _)| *dir).collect();
    assert_eq!(
        dirs,
        [
            "/usr/local/nvidia/lib64",
            "/usr/local/nvidia/lib",
            "/usr/local/nvidia/bin"
        ]
    );
    assert_eq!(gathered[0].1.len(), lib64.len());
    // A plan with no driver directory gathers nothing.
    assert!(crate::plan::driver_dirs::files_by_dir(&at_sonames).is_empty());
}

mod shadow {
    use super::*;
    use crate::plan::shadow::{Shadow, shadowing_libcuda};

    fn found_in<'a>(files: &'a [&'a str]) -> impl Fn(&str) -> bool + 'a {
        move |p| files.contains(&p)
    }

    #[test]
    fn an_image_libcuda_before_the_hosts_is_named() {
        let p = plan(&[&visible("0"), &caps("compute")]);
        let got = shadowing_libcuda(
            &p,
            Some("/usr/local/nvidia/lib64::relative:/opt/$LIB:/opt/stale/"),
            found_in(&["/opt/stale/libcuda.so.1", "/opt/later/libcuda.so.1"]),
        );
        assert_eq!(
            got,
            Some(Shadow {
                path: "/opt/stale/libcuda.so.1".into(),
                dir: "/opt/stale".into()
            })
        );
        let line = got.unwrap().to_string();
        assert!(line.contains("LD_LIBRARY_PATH lists /opt/stale"), "{line}");
    }

    #[test]
    fn the_plans_own_libcuda_first_is_no_shadow() {
        let p = plan(&[&visible("0"), &caps("compute")]);
        let ld = format!("{DEBIAN_LIB64};/opt/stale");
        assert_eq!(
            shadowing_libcuda(&p, Some(&ld), found_in(&["/opt/stale/libcuda.so.1"])),
            None
        );
        assert_eq!(shadowing_libcuda(&p, None, |_| true), None);
        assert_eq!(
            shadowing_libcuda(&p, Some("/opt/empty"), found_in(&[])),
            None
        );
    }
}
