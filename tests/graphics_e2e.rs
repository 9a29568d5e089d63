//! The graphics and display stack (issue 17 §3) and firmware from the kernel's custom path
//! (§3b), end to end with real runc and the prestart hook on a simulated node. Every file a
//! Vulkan, EGL, GBM or Xorg program opens must be where its loader looks, each library a
//! config names must load by that name, and a GPU's DRM nodes must open (ENXIO: the cgroup
//! allows them; no driver sits behind them) while another GPU's stay absent.
//! Run as root after `cargo build --workspace`: `cargo test --test graphics_e2e`.

use std::fs;
use std::path::Path;

use nvhook_test_support::{
    Bundle, Output, RuntimeEnv, SimNode, glibc_image, run_clean, run_nvhook,
};

const VERSION: &str = "550.54.15";
const LIB64: &str = "/usr/lib/x86_64-linux-gnu";

/// The configs the simulated driver installs, at the container paths their loaders read.
const CONFIGS: &[&str] = &[
    "/etc/vulkan/icd.d/nvidia_icd.json",
    "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
    "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
    "/usr/share/X11/xorg.conf.d/10-nvidia.conf",
    "/usr/share/nvidia/nvoptix.bin",
];

/// GPU 1 with `capabilities`; gpucheck runs `checks`.
fn start(node: &SimNode, capabilities: &str, checks: &[String]) -> Output {
    let mut args = vec!["/gpucheck"];
    args.extend(checks.iter().map(String::as_str));
    let mut bundle = Bundle::new(glibc_image(), &args);
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=1")
        .env(&format!("NVIDIA_DRIVER_CAPABILITIES={capabilities}"));
    bundle.prestart_hook(node);
    run_clean(&bundle, Some(node), RuntimeEnv::CgroupV1)
}

fn check(flag: &str, arg: &str) -> [String; 2] {
    [flag.to_string(), arg.to_string()]
}

/// The `library_path` of a JSON config as the driver installed it (read on the host: the
/// container gets the same file, bound read-only).
fn library_path(node: &SimNode, host_path: &str) -> String {
    let text = fs::read_to_string(node.driver_root().join(host_path)).expect("read config");
    let json: serde_json::Value = serde_json::from_str(&text).expect("config is JSON");
    ["ICD", "layer"]
        .iter()
        .find_map(|k| json.get(k)?.get("library_path")?.as_str())
        .expect("library_path")
        .to_string()
}

#[test]
fn graphics_and_display_put_every_file_where_its_loader_looks() {
    let node = SimNode::create_with(2, &["--drm"]);
    let sonames: Vec<String> = [
        "usr/share/vulkan/icd.d/nvidia_icd.json",
        "usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
        "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        "usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
    ]
    .iter()
    .map(|c| library_path(&node, c))
    .collect();
    let gbm = format!("{LIB64}/gbm/nvidia-drm_gbm.so");
    let xorg_driver = "/usr/lib/xorg/modules/drivers/nvidia_drv.so";
    let glx_server = "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so";
    let mut checks: Vec<String> = Vec::new();
    for path in CONFIGS.iter().chain(&[xorg_driver, glx_server]) {
        checks.extend(check("--stat", path));
    }
    for soname in &sonames {
        checks.extend(check("--dlopen", soname));
    }
    // GBM opens its backend by path; Xorg opens its modules by path.
    for path in [gbm.as_str(), xorg_driver, glx_server] {
        checks.extend(check("--dlopen", path));
    }
    for dev in [
        "/dev/dri/card1",
        "/dev/dri/renderD129",
        "/dev/dri/card0",
        "/dev/dri/renderD128",
        "/dev/nvidia-modeset",
    ] {
        checks.extend(check("--dev", dev));
    }
    checks.extend(check("--stat", "/dev/dri/renderD129"));
    let output = start(&node, "graphics,display", &checks);
    output.assert_success();

    let mut lines: Vec<String> = CONFIGS
        .iter()
        .chain(&[xorg_driver, glx_server])
        .map(|p| format!("stat {p} file 0:0"))
        .collect();
    for soname in &sonames {
        // Found by name through the loader cache nvhook wrote, in the image's library dir.
        lines.push(format!("dlopen {soname} ok {LIB64}/{soname}"));
    }
    for path in [gbm.as_str(), xorg_driver, glx_server] {
        lines.push(format!("dlopen {path} ok {path}"));
    }
    lines.extend([
        "dev /dev/dri/card1 ENXIO".into(),
        "dev /dev/dri/renderD129 ENXIO".into(),
        "dev /dev/dri/card0 absent".into(),
        "dev /dev/dri/renderD128 absent".into(),
        "dev /dev/nvidia-modeset ENXIO".into(),
        "stat /dev/dri/renderD129 char 226:129".into(),
    ]);
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    output.assert_lines(&lines);
    // The libraries behind the EGL platform configs carry versions of their own.
    assert!(
        output.stdout.contains("dlopen libnvidia-egl-gbm.so.1 ok"),
        "{output}"
    );
}

#[test]
fn a_headless_host_serves_graphics_without_drm_nodes() {
    // No nvidia-drm, no modeset node: a data-centre host; CUDA images still ask for `all`.
    let node = SimNode::create(2);
    fs::remove_file(node.dev_root().join("dev/nvidia-modeset")).expect("remove modeset");
    let mut checks = Vec::new();
    checks.extend(check("--ls", "/dev"));
    checks.extend(check("--stat", "/etc/vulkan/icd.d/nvidia_icd.json"));
    let output = start(&node, "all", &checks);
    output.assert_success();
    output.assert_lines(&[
        "dlopen libcuda.so.1 ok",
        "stat /etc/vulkan/icd.d/nvidia_icd.json file 0:0",
    ]);
    assert!(!output.stdout.contains("ls /dev dri"), "{output}");
}

#[test]
fn compute_alone_gets_no_graphics_file_or_drm_node() {
    let node = SimNode::create_with(2, &["--drm"]);
    let mut checks = Vec::new();
    for path in ["/dev/dri/card1", "/etc/vulkan/icd.d/nvidia_icd.json"] {
        checks.extend(check("--stat", path));
    }
    checks.extend(check("--stat", "/etc/OpenCL/vendors/nvidia.icd"));
    let output = start(&node, "compute,utility", &checks);
    output.assert_success();
    output.assert_lines(&[
        "stat /dev/dri/card1 absent",
        "stat /etc/vulkan/icd.d/nvidia_icd.json absent",
        // OpenCL's ICD file comes with compute, which brings libnvidia-opencl.
        "stat /etc/OpenCL/vendors/nvidia.icd file 0:0",
    ]);
}

#[test]
fn firmware_comes_from_the_kernels_custom_firmware_path() {
    // A driver kept under /usr/local/nvidia, with firmware_class.path pointing there.
    let custom = "/usr/local/nvidia/firmware";
    let node = SimNode::create_with(2, &["--firmware-path", custom]);
    assert!(!node.driver_root().join("lib/firmware/nvidia").exists());
    let files: Vec<String> = ["gsp_ga10x.bin", "gsp_tu10x.bin"]
        .iter()
        .map(|f| format!("{custom}/nvidia/{VERSION}/{f}"))
        .collect();
    let mut checks = Vec::new();
    for f in &files {
        checks.extend(check("--stat", f));
    }
    let output = start(&node, "compute,utility", &checks);
    output.assert_success();
    for f in &files {
        output.assert_lines(&[&format!("stat {f} file 0:0")]);
    }

    // `nvhook plan` names them too.
    let bundle = Bundle::new(glibc_image(), &["/gpucheck"]);
    let mut bundle = bundle;
    bundle.env("NVIDIA_VISIBLE_DEVICES=1");
    bundle.write_config();
    let config = node.config();
    let plan = run_nvhook(&[
        "--config",
        config.to_str().unwrap(),
        "plan",
        "--bundle",
        bundle.dir().to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(plan.status.success(), "{text}");
    for f in &files {
        assert!(text.contains(&format!("  {f} <- ")), "{f} not in\n{text}");
    }
    assert!(Path::new(&node.driver_root().join(files[0].trim_start_matches('/'))).is_file());
}
