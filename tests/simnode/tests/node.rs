//! End-to-end checks of `simnode create` / `destroy`: run the real binary as
//! root and inspect what it built with independent tools (readelf, ldconfig,
//! dlopen, stat), against the layout other crates depend on.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tempfile::TempDir;

const VERSION: &str = "550.54.15";
const LIB64: &str = "driver/usr/lib/x86_64-linux-gnu";
const LIB32: &str = "driver/usr/lib/i386-linux-gnu";

/// (library name, SONAME, has a compat32 copy), written out independently
/// of simnode's own table.
const LIBRARIES: &[(&str, &str, bool)] = &[
    ("nvidia-ml", "libnvidia-ml.so.1", true),
    ("nvidia-cfg", "libnvidia-cfg.so.1", true),
    ("nvidia-nscq", "libnvidia-nscq.so.2", true),
    ("cuda", "libcuda.so.1", true),
    ("cudadebugger", "libcudadebugger.so.1", true),
    ("nvidia-opencl", "libnvidia-opencl.so.1", true),
    ("nvidia-gpucomp", "libnvidia-gpucomp.so.550.54.15", true),
    (
        "nvidia-ptxjitcompiler",
        "libnvidia-ptxjitcompiler.so.1",
        true,
    ),
    (
        "nvidia-fatbinaryloader",
        "libnvidia-fatbinaryloader.so.550.54.15",
        true,
    ),
    ("nvidia-allocator", "libnvidia-allocator.so.1", true),
    ("nvidia-compiler", "libnvidia-compiler.so.550.54.15", true),
    ("nvidia-pkcs11", "libnvidia-pkcs11.so.550.54.15", true),
    (
        "nvidia-pkcs11-openssl3",
        "libnvidia-pkcs11-openssl3.so.550.54.15",
        true,
    ),
    ("nvidia-nvvm", "libnvidia-nvvm.so.4", true),
    ("vdpau_nvidia", "libvdpau_nvidia.so.1", false),
    ("nvidia-encode", "libnvidia-encode.so.1", false),
    ("nvidia-opticalflow", "libnvidia-opticalflow.so.1", false),
    ("nvcuvid", "libnvcuvid.so.1", false),
    ("nvidia-eglcore", "libnvidia-eglcore.so.550.54.15", false),
    ("nvidia-glcore", "libnvidia-glcore.so.550.54.15", false),
    ("nvidia-tls", "libnvidia-tls.so.550.54.15", false),
    ("nvidia-glsi", "libnvidia-glsi.so.550.54.15", false),
    ("nvidia-fbc", "libnvidia-fbc.so.1", false),
    ("nvidia-ifr", "libnvidia-ifr.so.1", false),
    ("nvidia-rtcore", "libnvidia-rtcore.so.550.54.15", false),
    ("nvoptix", "libnvoptix.so.1", false),
    ("GLX_nvidia", "libGLX_nvidia.so.0", false),
    ("EGL_nvidia", "libEGL_nvidia.so.0", false),
    ("GLESv2_nvidia", "libGLESv2_nvidia.so.2", false),
    ("GLESv1_CM_nvidia", "libGLESv1_CM_nvidia.so.1", false),
    (
        "nvidia-glvkspirv",
        "libnvidia-glvkspirv.so.550.54.15",
        false,
    ),
    ("nvidia-cbl", "libnvidia-cbl.so.550.54.15", false),
    ("nvidia-ngx", "libnvidia-ngx.so.1", false),
];

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "simnode tests must run as root (they mknod device nodes)"
    );
}

/// A scratch directory on the target's file system (not a nodev /tmp), so
/// that opening the simulated device nodes reaches the missing driver.
fn scratch() -> TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch dir")
}

/// A stand-in for the mock NVML: the tests check simnode, not the mock, and
/// must not depend on another crate having been built.
fn stand_in_nvml(dir: &Path) -> PathBuf {
    let path = dir.join("libstand_in_nvml.so");
    let status = Command::new("cc")
        .args([
            "-x",
            "c",
            "-",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
        ])
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(b"int nvmlInit_v2(void) { return 0; }\n")?;
            child.wait()
        })
        .expect("run cc");
    assert!(status.success(), "cc failed to build the stand-in NVML");
    path
}

fn simnode(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_simnode"))
        .args(args)
        .output()
        .expect("run simnode")
}

fn create(node: &Path, nvml: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "create",
        node.to_str().unwrap(),
        "--mock-nvml",
        nvml.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = simnode(&args);
    assert!(
        out.status.success(),
        "simnode create failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn soname(path: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(path)
        .output()
        .expect("run readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("(SONAME)"))
        .unwrap_or_else(|| panic!("{} has no SONAME", path.display()));
    line.split('[')
        .nth(1)
        .unwrap()
        .trim_end_matches(']')
        .to_owned()
}

/// ELF class byte: 1 for 32-bit, 2 for 64-bit.
fn elf_class(path: &Path) -> u8 {
    let bytes = fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF", "{} is not ELF", path.display());
    bytes[4]
}

/// `name major` pairs from the "Character devices:" section.
fn char_majors(proc_devices: &str) -> BTreeMap<String, u32> {
    proc_devices
        .lines()
        .skip_while(|l| *l != "Character devices:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| {
            let (major, name) = l.trim_start().split_once(' ').expect("major name");
            (name.to_owned(), major.parse().expect("numeric major"))
        })
        .collect()
}

fn char_device(path: &Path) -> (u32, u32, u32) {
    let meta = fs::metadata(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
    assert!(
        meta.file_type().is_char_device(),
        "{} is not a character device",
        path.display()
    );
    let rdev = meta.rdev();
    (libc::major(rdev), libc::minor(rdev), meta.mode() & 0o7777)
}

struct Dl(*mut libc::c_void);

impl Dl {
    fn open(path: &Path) -> Dl {
        let c = CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: valid C string; the libraries have no constructors.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen {} failed", path.display());
        Dl(handle)
    }

    fn sym(&self, name: &str) -> *mut libc::c_void {
        let c = CString::new(name).unwrap();
        // SAFETY: handle is a live dlopen handle.
        let sym = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        assert!(!sym.is_null(), "symbol {name} missing");
        sym
    }
}

impl Drop for Dl {
    fn drop(&mut self) {
        // SAFETY: handle came from dlopen and no symbol outlives self.
        unsafe { libc::dlclose(self.0) };
    }
}

#[test]
fn four_gpu_node_with_mig() {
    require_root();
    let tmp = scratch();
    let nvml = stand_in_nvml(tmp.path());
    let node = tmp.path().join("node");
    let summary = create(&node, &nvml, &["--mig", "1:2"]);
    let topology: serde_json::Value =
        serde_json::from_str(&read(&node.join(LIB64).join("nvml-topology.json"))).unwrap();

    check_libraries(&node);
    check_libcuda(&node);
    check_loader_cache(&node);
    let majors = check_proc_devices(&node);
    check_device_nodes(&node, &majors);
    check_mig_capabilities(&node, majors["nvidia-caps"]);
    check_topology(&topology);
    check_proc_gpus(&node, &topology);
    check_tools(&node, &topology);
    check_other_files(&node);
    check_config(&node);
    for gpu in topology["gpus"].as_array().unwrap() {
        assert!(
            summary.contains(gpu["uuid"].as_str().unwrap()),
            "summary lacks a UUID: {summary}"
        );
    }
}

fn check_libraries(node: &Path) {
    for &(name, expected, compat32) in LIBRARIES {
        let file = format!("lib{name}.so.{VERSION}");
        let lib64 = node.join(LIB64).join(&file);
        assert_eq!(elf_class(&lib64), 2, "{file}");
        assert_eq!(soname(&lib64), expected, "{file}");
        if name != "nvidia-ml" {
            let dl = Dl::open(&lib64);
            let marker = format!("nvhook_sim_{}", name.replace('-', "_"));
            // SAFETY: the marker function is `const char *(void)`.
            let f: extern "C" fn() -> *const libc::c_char =
                unsafe { std::mem::transmute(dl.sym(&marker)) };
            // SAFETY: it returns a static NUL-terminated string.
            let text = unsafe { CStr::from_ptr(f()) }.to_str().unwrap().to_owned();
            assert!(
                text.contains(&file) && text.contains(VERSION),
                "{marker}() said {text:?}"
            );
        }
        let lib32 = node.join(LIB32).join(&file);
        assert_eq!(lib32.exists(), compat32, "compat32 copy of {file}");
        if compat32 {
            assert_eq!(elf_class(&lib32), 1, "{file} (32-bit)");
            assert_eq!(soname(&lib32), expected, "{file} (32-bit)");
        }
    }
}

fn check_libcuda(node: &Path) {
    let dl = Dl::open(&node.join(LIB64).join("libcuda.so.1"));
    // SAFETY: the signatures are the CUDA driver API's.
    let cu_init: extern "C" fn(u32) -> i32 = unsafe { std::mem::transmute(dl.sym("cuInit")) };
    let get_version: extern "C" fn(*mut i32) -> i32 =
        // SAFETY: as above.
        unsafe { std::mem::transmute(dl.sym("cuDriverGetVersion")) };
    assert_eq!(cu_init(0), 0);
    let mut version = 0;
    assert_eq!(get_version(&mut version), 0);
    assert_eq!(version, 12040);
}

fn check_loader_cache(node: &Path) {
    let out = Command::new("/sbin/ldconfig")
        .arg("-C")
        .arg(node.join("driver/etc/ld.so.cache"))
        .arg("-p")
        .output()
        .expect("run ldconfig");
    let listing = String::from_utf8_lossy(&out.stdout);
    for entry in [
        "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1",
        "\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "\tlibnvidia-glcore.so.550.54.15 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-glcore.so.550.54.15",
    ] {
        assert!(
            listing.lines().any(|l| l == entry),
            "cache lacks {entry:?}:\n{listing}"
        );
    }
    let link = fs::read_link(node.join(LIB64).join("libcuda.so.1")).unwrap();
    assert_eq!(link, Path::new("libcuda.so.550.54.15"));
}

fn check_proc_devices(node: &Path) -> BTreeMap<String, u32> {
    let majors = char_majors(&read(&node.join("proc/devices")));
    assert_eq!(majors["nvidia"], 195);
    let host = char_majors(&read(Path::new("/proc/devices")));
    for name in ["nvidia-uvm", "nvidia-caps"] {
        let major = majors[name];
        assert!(
            !host.values().any(|&m| m == major),
            "{name} major {major} is taken on this host"
        );
    }
    assert_ne!(majors["nvidia-uvm"], majors["nvidia-caps"]);
    majors
}

fn check_device_nodes(node: &Path, majors: &BTreeMap<String, u32>) {
    let dev = node.join("dev");
    for minor in 0..4 {
        assert_eq!(
            char_device(&dev.join(format!("nvidia{minor}"))),
            (195, minor, 0o666)
        );
    }
    assert!(!dev.join("nvidia4").exists());
    assert_eq!(char_device(&dev.join("nvidiactl")), (195, 255, 0o666));
    assert_eq!(char_device(&dev.join("nvidia-modeset")), (195, 254, 0o666));
    let uvm = majors["nvidia-uvm"];
    assert_eq!(char_device(&dev.join("nvidia-uvm")), (uvm, 0, 0o666));
    assert_eq!(char_device(&dev.join("nvidia-uvm-tools")), (uvm, 1, 0o666));
    // No driver answers: the node opens to ENXIO, which container tests use
    // to tell "allowed by the cgroup" from EPERM.
    for name in ["nvidia0", "nvidia-uvm"] {
        let err = fs::File::open(dev.join(name)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENXIO), "{name}");
    }
}

fn check_mig_capabilities(node: &Path, caps_major: u32) {
    let root = node.join("proc/driver/nvidia/capabilities");
    let expected = [
        ("mig/config", 0o400),
        ("mig/monitor", 0o400),
        ("gpu1/mig/gi1/access", 0o444),
        ("gpu1/mig/gi1/ci0/access", 0o444),
        ("gpu1/mig/gi2/access", 0o444),
        ("gpu1/mig/gi2/ci0/access", 0o444),
    ];
    let mut minors = Vec::new();
    for (file, mode) in expected {
        let text = read(&root.join(file));
        let field = |key: &str| -> u32 {
            let line = text
                .lines()
                .find(|l| l.starts_with(key))
                .unwrap_or_else(|| panic!("{file}: no {key}"));
            line[key.len()..].trim().parse().unwrap()
        };
        let minor = field("DeviceFileMinor:");
        assert_eq!(field("DeviceFileMode:"), mode, "{file}");
        assert_eq!(field("DeviceFileModify:"), 1, "{file}");
        let node_path = node.join(format!("dev/nvidia-caps/nvidia-cap{minor}"));
        assert_eq!(char_device(&node_path), (caps_major, minor, mode), "{file}");
        minors.push(minor);
    }
    assert_eq!(minors[..2], [1, 2]);
    assert!(!root.join("gpu0").exists(), "GPU 0 has MIG off");
    let nodes = fs::read_dir(node.join("dev/nvidia-caps")).unwrap().count();
    assert_eq!(nodes, expected.len());
}

fn check_topology(topology: &serde_json::Value) {
    assert_eq!(topology["driver_version"], VERSION);
    assert_eq!(topology["cuda_driver_version"], 12040);
    assert_eq!(topology["nvml_version"], "12.550.54.15");
    assert_eq!(topology["init_error"], 0);
    assert_eq!(topology["init_delay_ms"], 0);
    let gpus = topology["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 4);
    let mut ids = Vec::new();
    for (i, gpu) in gpus.iter().enumerate() {
        assert_eq!(gpu["minor"], i);
        assert_eq!(gpu["name"], "NVIDIA A100-SXM4-80GB");
        assert_eq!(gpu["cuda_compute_capability"], serde_json::json!([8, 0]));
        let bus = gpu["pci_bus_id"].as_str().unwrap();
        assert!(
            bus.starts_with("00000000:") && bus.ends_with(":00.0") && bus == bus.to_uppercase(),
            "{bus}"
        );
        let mig = gpu["mig_devices"].as_array().unwrap();
        assert_eq!(
            (gpu["mig_mode"].as_u64(), mig.len()),
            if i == 1 { (Some(1), 2) } else { (Some(0), 0) }
        );
        ids.push(gpu["uuid"].as_str().unwrap().to_owned());
        ids.push(bus.to_owned());
        ids.extend(mig.iter().map(|m| m["uuid"].as_str().unwrap().to_owned()));
    }
    for uuid in ids.iter().filter(|id| !id.starts_with('0')) {
        let hex = uuid.split_once('-').unwrap().1;
        let groups: Vec<usize> = hex.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{uuid}");
        assert!(
            hex.chars().all(|c| c == '-' || c.is_ascii_hexdigit()),
            "{uuid}"
        );
    }
    let count = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), count, "UUIDs and bus ids must be distinct");
}

fn check_proc_gpus(node: &Path, topology: &serde_json::Value) {
    for gpu in topology["gpus"].as_array().unwrap() {
        // NVML's 00000000:18:00.0 is the kernel's 0000:18:00.0.
        let busid = gpu["pci_bus_id"].as_str().unwrap()[4..].to_lowercase();
        let info = read(
            &node
                .join("proc/driver/nvidia/gpus")
                .join(&busid)
                .join("information"),
        );
        let field = |key: &str| {
            let line = info
                .lines()
                .find(|l| l.starts_with(key))
                .unwrap_or_else(|| panic!("no {key} in {info}"));
            line[key.len()..].trim().to_owned()
        };
        assert_eq!(field("Model:"), gpu["name"].as_str().unwrap());
        assert_eq!(field("GPU UUID:"), gpu["uuid"].as_str().unwrap());
        assert_eq!(field("Device Minor:"), gpu["minor"].to_string());
        assert_eq!(field("Bus Location:"), busid);
    }
    let nv = node.join("proc/driver/nvidia");
    assert!(
        read(&nv.join("params"))
            .lines()
            .any(|l| l == "ModifyDeviceFiles: 1")
    );
    assert!(read(&nv.join("version")).starts_with(&format!(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {VERSION} "
    )));
    assert!(nv.join("registry").is_file());
}

fn check_tools(node: &Path, topology: &serde_json::Value) {
    let smi = node.join("driver/usr/bin/nvidia-smi");
    // Here, as in a container given no GPU, no node of the simulated GPUs is at /dev.
    let out = Command::new(&smi).output().expect("run nvidia-smi");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success());
    assert!(
        text.starts_with(&format!("NVIDIA-SMI simulated {VERSION}\n")),
        "{text}"
    );
    assert!(!text.contains("UUID"), "{text}");
    // With the node's /dev at /dev (in a mount namespace of its own), every GPU.
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount --bind \"$1\" /dev && exec \"$2\"")
        .arg("sh")
        .arg(node.join("dev"))
        .arg(&smi)
        .output()
        .expect("run nvidia-smi under unshare");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (i, gpu) in topology["gpus"].as_array().unwrap().iter().enumerate() {
        let line = format!("GPU {i}: ");
        assert!(text.contains(&line), "{text}");
        assert!(text.contains(gpu["uuid"].as_str().unwrap()), "{text}");
    }
    for tool in [
        "nvidia-debugdump",
        "nvidia-persistenced",
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
    ] {
        let path = node.join("driver/usr/bin").join(tool);
        let out = Command::new(&path)
            .output()
            .unwrap_or_else(|e| panic!("run {tool}: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(tool) && text.contains(VERSION),
            "{tool}: {text}"
        );
        // Static: no PT_INTERP, so it runs in a busybox image.
        let headers = Command::new("readelf")
            .arg("-l")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            !String::from_utf8_lossy(&headers.stdout).contains("INTERP"),
            "{tool} is dynamic"
        );
    }
}

fn check_other_files(node: &Path) {
    let driver = node.join("driver");
    for socket in [
        "run/nvidia-persistenced/socket",
        "run/nvidia-fabricmanager/socket",
    ] {
        let meta = fs::symlink_metadata(driver.join(socket)).unwrap();
        assert!(meta.file_type().is_socket(), "{socket}");
    }
    for chip in ["ga10x", "tu10x"] {
        let fw = read(&driver.join(format!("lib/firmware/nvidia/{VERSION}/gsp_{chip}.bin")));
        assert!(fw.contains(chip) && fw.contains(VERSION));
    }
    for json in [
        "usr/share/vulkan/icd.d/nvidia_icd.json",
        "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    ] {
        let value: serde_json::Value = serde_json::from_str(&read(&driver.join(json))).unwrap();
        assert!(
            value["ICD"]["library_path"]
                .as_str()
                .unwrap()
                .contains("_nvidia.so.0"),
            "{json}"
        );
    }
    let conf = read(&driver.join("etc/ld.so.conf"));
    assert_eq!(conf, "/usr/lib/x86_64-linux-gnu\n/usr/lib/i386-linux-gnu\n");
    let marker: serde_json::Value = serde_json::from_str(&read(&node.join(".simnode"))).unwrap();
    assert_eq!(marker["params"]["gpus"], 4);
}

fn check_config(node: &Path) {
    let config: toml::Table = read(&node.join("config.toml")).parse().unwrap();
    let node = node.canonicalize().unwrap();
    let path = |p: &Path| toml::Value::String(p.to_str().unwrap().to_owned());
    assert_eq!(config["driver-root"], path(&node.join("driver")));
    assert_eq!(config["dev-root"], path(&node));
    assert_eq!(config["proc-root"], path(&node.join("proc")));
    assert_eq!(config["sys-root"], path(&node.join("sys")));
    assert_eq!(config["log-file"], path(&node.join("nvhook.log")));
    assert_eq!(config["log-level"].as_str(), Some("debug"));
    let hook = Path::new(config["hook-path"].as_str().unwrap());
    assert_eq!(
        hook,
        Path::new(env!("CARGO_BIN_EXE_simnode")).with_file_name("nvhook")
    );
    assert_eq!(
        config["nvml-cache-file"],
        path(&node.join("run/nvml-inventory.json"))
    );
    // The node's own, where no bpffs is unless a test mounts one: none of the host's.
    assert_eq!(
        config["device-program-pins"],
        path(&node.join("bpf/nvhook"))
    );
    assert!(!config.contains_key("nvml-library"));
    assert_eq!(config.len(), 9);
}

#[test]
fn recreate_replaces_the_node() {
    require_root();
    let tmp = scratch();
    let nvml = stand_in_nvml(tmp.path());
    let node = tmp.path().join("node");
    create(&node, &nvml, &["--mig", "1:2"]);
    fs::write(node.join("driver/stale"), "left from the first node").unwrap();
    create(
        &node,
        &nvml,
        &[
            "--gpus",
            "2",
            "--driver-version",
            "535.104.05",
            "--nvml-init-error",
            "3",
        ],
    );

    assert!(!node.join("driver/stale").exists());
    assert!(!node.join("dev/nvidia2").exists());
    assert!(!node.join("proc/driver/nvidia/capabilities/gpu1").exists());
    assert!(
        !node
            .join(LIB64)
            .join(format!("libcuda.so.{VERSION}"))
            .exists()
    );
    assert!(node.join(LIB64).join("libcuda.so.535.104.05").exists());
    let topology: serde_json::Value =
        serde_json::from_str(&read(&node.join(LIB64).join("nvml-topology.json"))).unwrap();
    assert_eq!(topology["gpus"].as_array().unwrap().len(), 2);
    assert_eq!(topology["init_error"], 3);
    // Before 550 the GPU major is called nvidia-frontend.
    assert_eq!(
        char_majors(&read(&node.join("proc/devices")))["nvidia-frontend"],
        195
    );
}

#[test]
fn destroy_removes_a_node() {
    require_root();
    let tmp = scratch();
    let nvml = stand_in_nvml(tmp.path());
    let node = tmp.path().join("node");
    create(&node, &nvml, &["--gpus", "1"]);
    let out = simnode(&["destroy", node.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!node.exists());
}

#[test]
fn destroy_and_create_refuse_a_directory_simnode_did_not_make() {
    require_root();
    let tmp = scratch();
    let precious = tmp.path().join("precious");
    fs::create_dir(&precious).unwrap();
    fs::write(precious.join("data"), "keep me").unwrap();

    let out = simnode(&["destroy", precious.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing") && err.contains(".simnode"),
        "{err}"
    );

    let nvml = stand_in_nvml(tmp.path());
    let out = simnode(&[
        "create",
        precious.to_str().unwrap(),
        "--mock-nvml",
        nvml.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert_eq!(read(&precious.join("data")), "keep me");
}

#[test]
fn create_rejects_bad_flags_with_the_flag_named() {
    require_root();
    let tmp = scratch();
    let node = tmp.path().join("node");
    let out = simnode(&["create", node.to_str().unwrap(), "--mig", "4:1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mig 4:1: no GPU 4"));
    let missing = tmp.path().join("no-such-nvml.so");
    let out = simnode(&[
        "create",
        node.to_str().unwrap(),
        "--mock-nvml",
        missing.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("mock NVML not found"));
}
