//! CUDA forward compatibility (issue 17 §1), end to end with real runc and the prestart hook
//! on a simulated node: an image that ships a compat driver's libraries under
//! `/usr/local/cuda-12.9/compat` (and `/usr/local/cuda` linking there), on nodes whose driver
//! is older and newer than it. In the container `/gpucheck` dlopens `libcuda.so.1` by name and
//! prints the file its loader resolved. Hostile compat directories (a link out of the rootfs,
//! a library that links to `/proc/self/...`, a version that does not parse) start with the
//! host's library and touch nothing outside the rootfs. The loader cache names the compat
//! file itself: nothing is written in the compat directory (see hostile_images.rs's volumes).
//! Also through nvhook-runtime's cdi mode, a generated CDI spec under Podman, `nvhook plan`,
//! and scripts/gpu-node-check.sh's compat check.
//! Run as root after `cargo build --workspace`: `cargo test --test cuda_compat_e2e`.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::OnceLock;

use nvhook_test_support::engines::{nvhook_runtime_bin, unique_name};
use nvhook_test_support::gpu_kit;
use nvhook_test_support::podman::{CdiSpecFile, Podman};
use nvhook_test_support::{
    Bundle, CUDA_COMPAT_DIR, GlibcImageOptions, Image, Output, RuntimeEnv, SimNode, Snapshot,
    build_glibc_image, glibc_image, host_mounts_referencing, host_snapshot, nvhook_bin,
    require_root, run_clean, run_container_with, target_tmp_dir,
};

const COMPAT_VERSION: &str = "580.95.05";
const OLDER_HOST: &str = "550.54.15";
const NEWER_HOST: &str = "580.159.03";
const LIB64: &str = "/usr/lib/x86_64-linux-gnu";

fn compat_image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = target_tmp_dir().join(format!("cuda-compat-e2e-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create image dir");
        build_glibc_image(
            &dir,
            GlibcImageOptions {
                cuda_compat: Some(COMPAT_VERSION),
                ..GlibcImageOptions::default()
            },
        )
    })
}

fn node(driver_version: &str) -> SimNode {
    SimNode::create_with(1, &["--driver-version", driver_version])
}

/// GPU 0 with compute, on `node`; `edit` changes the bundle's rootfs first.
fn start(node: &SimNode, image: &Image, edit: impl FnOnce(&Path)) -> (Output, Bundle) {
    let mut bundle = Bundle::new(
        image,
        &[
            "/gpucheck",
            "--stat",
            "/etc/ld.so.conf.d/00-compat-nvhook.conf",
        ],
    );
    bundle.env("NVIDIA_VISIBLE_DEVICES=0");
    bundle.env("NVIDIA_DRIVER_CAPABILITIES=compute,utility");
    edit(bundle.rootfs());
    bundle.prestart_hook(node);
    let output = run_clean(&bundle, Some(node), RuntimeEnv::CgroupV1);
    output.assert_success();
    (output, bundle)
}

/// The loader resolved `libcuda.so.1` to the host driver's file nvhook mounted.
#[track_caller]
fn assert_host_libcuda(output: &Output, node: &SimNode) {
    output.assert_lines(&[
        "cuInit 0",
        &format!("dlopen libcuda.so.1 path {LIB64}/libcuda.so.1"),
        &format!(
            "dlopen libcuda.so.1 file {LIB64}/libcuda.so.{}",
            node.driver_version()
        ),
        "stat /etc/ld.so.conf.d/00-compat-nvhook.conf absent",
    ]);
}

/// The loader resolved `libcuda.so.1` to the image's compat file, through the cache entry
/// nvhook wrote, and the hook's log says why.
#[track_caller]
fn assert_compat_libcuda(output: &Output, node: &SimNode) {
    output.assert_lines(&[
        // The compat stand-in's answer, not the host driver's 0.
        "cuInit 999",
        &format!("dlopen libcuda.so.1 path /usr/local/cuda/compat/libcuda.so.{COMPAT_VERSION}"),
        &format!("dlopen libcuda.so.1 file {CUDA_COMPAT_DIR}/libcuda.so.{COMPAT_VERSION}"),
        "stat /etc/ld.so.conf.d/00-compat-nvhook.conf file 0:0",
    ]);
    let log = node.log();
    assert!(
        log.contains(&format!(
            "compat {COMPAT_VERSION} is newer than host driver {OLDER_HOST}: the compat libraries"
        )),
        "{log}"
    );
}

#[test]
fn an_older_host_driver_loads_the_images_compat_libcuda() {
    let node = node(OLDER_HOST);
    let (output, bundle) = start(&node, compat_image(), |_| {});
    assert_compat_libcuda(&output, &node);
    // `nvhook plan` says the same, and why.
    let plan = std::process::Command::new(nvhook_bin())
        .arg("--config")
        .arg(node.config())
        .args(["plan", "--bundle"])
        .arg(bundle.dir())
        .output()
        .expect("run nvhook plan");
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(
        text.contains(&format!(
            "CUDA compat: compat {COMPAT_VERSION} is newer than host driver {OLDER_HOST}: the compat libraries in /usr/local/cuda/compat"
        )) && text.contains("  libcuda.so.1 -> /usr/local/cuda/compat/libcuda.so.1"),
        "{text}"
    );
}

/// nvhook-runtime in `runtime-mode = "cdi"`: the per-container plan decided, and the
/// createRuntime hook writes its cache entries.
#[test]
fn nvhook_runtimes_cdi_mode_loads_the_compat_libcuda() {
    require_root();
    let node = node(OLDER_HOST);
    node.configure("runtime-mode = \"cdi\"");
    let mut bundle = Bundle::new(
        compat_image(),
        &[
            "/gpucheck",
            "--stat",
            "/etc/ld.so.conf.d/00-compat-nvhook.conf",
        ],
    );
    bundle.env("NVIDIA_VISIBLE_DEVICES=0");
    let config = node.config();
    let mut output = run_container_with(
        &bundle,
        RuntimeEnv::CgroupV1,
        nvhook_runtime_bin(),
        &[("NVHOOK_CONFIG", &config)],
    );
    output.hook_log = Some(node.log());
    output.assert_success();
    assert_compat_libcuda(&output, &node);
    let leaked = host_mounts_referencing(&[bundle.dir(), node.root()]);
    assert!(leaked.is_empty(), "mounts left on the host: {leaked:#?}");
}

/// A static CDI spec serves any image: its createRuntime hook decides when the container
/// is made, from the host driver version the spec was written for.
#[test]
fn a_generated_cdi_spec_loads_the_compat_libcuda_through_podman() {
    require_root();
    let node = node(OLDER_HOST);
    let spec = CdiSpecFile::new("yaml");
    node.generate_cdi_spec(spec.path());
    let podman = Podman::new();
    let image = format!("localhost/{}:latest", unique_name("nvhook-cuda-compat"));
    podman.import(compat_image().rootfs(), &image);
    let args = [
        "/gpucheck",
        "--stat",
        "/etc/ld.so.conf.d/00-compat-nvhook.conf",
    ];
    let mut output = podman.run(&["--device", "nvidia.com/gpu=0"], &image, &args);
    output.hook_log = Some(node.log());
    output.assert_success();
    assert_compat_libcuda(&output, &node);
}

#[test]
fn a_newer_host_driver_keeps_its_own_libcuda() {
    let node = node(NEWER_HOST);
    let (output, _bundle) = start(&node, compat_image(), |_| {});
    assert_host_libcuda(&output, &node);
    let log = node.log();
    assert!(
        log.contains(&format!(
            "host driver {NEWER_HOST} is the same or newer than compat {COMPAT_VERSION}"
        )),
        "{log}"
    );
}

#[test]
fn cuda_compat_off_keeps_the_hosts_libcuda() {
    let node = node(OLDER_HOST);
    node.configure("cuda-compat = \"off\"");
    let (output, _bundle) = start(&node, compat_image(), |_| {});
    assert_host_libcuda(&output, &node);
}

#[test]
fn an_image_without_compat_libraries_is_as_before() {
    let node = node(OLDER_HOST);
    let (output, _bundle) = start(&node, glibc_image(), |_| {});
    assert_host_libcuda(&output, &node);
    assert!(!node.log().contains("CUDA compat"), "{}", node.log());
}

/// `make` builds the compat directory (given the rootfs's `/usr/local/cuda-12.9`, whose own
/// compat directory is gone); `canary` is a host directory with a newer "libcuda" that a
/// hostile link may name. The container starts with the host's libcuda, `why` is in the log
/// (none: no compat directory was found), and neither the canary nor the host changed.
#[track_caller]
fn hostile(make: impl FnOnce(&Path, &Path), why: Option<&str>) {
    let canary = tempfile::tempdir().expect("temp dir");
    fs::write(canary.path().join("libcuda.so.999.0.0"), b"a host file").unwrap();
    let (canary_before, host_before) = (Snapshot::tree(canary.path()), host_snapshot());
    let node = node(OLDER_HOST);
    let (output, _bundle) = start(&node, compat_image(), |rootfs| {
        let cuda = rootfs.join("usr/local/cuda-12.9");
        fs::remove_dir_all(cuda.join("compat")).expect("remove the compat dir");
        make(&cuda, canary.path());
    });
    assert_host_libcuda(&output, &node);
    let log = node.log();
    match why {
        Some(why) => assert!(log.contains(why), "{why:?} not in the log:\n{log}"),
        None => assert!(!log.contains("CUDA compat"), "{log}"),
    }
    assert_eq!(
        canary_before.diff(&Snapshot::tree(canary.path())),
        Vec::<String>::new()
    );
    assert_eq!(host_before.diff(&host_snapshot()), Vec::<String>::new());
}

#[test]
fn a_compat_dir_linking_out_of_the_rootfs_stays_inside_it() {
    // Inside the rootfs the link names a directory that is not there: no compat at all.
    hostile(
        |cuda, canary| symlink(canary, cuda.join("compat")).unwrap(),
        None,
    );
}

#[test]
fn a_compat_libcuda_linking_to_proc_self_is_not_a_library() {
    hostile(
        |cuda, _| {
            let compat = cuda.join("compat");
            fs::create_dir(&compat).unwrap();
            symlink(
                "/proc/self/root/usr/lib/x86_64-linux-gnu/libc.so.6",
                compat.join("libcuda.so.999.0.0"),
            )
            .unwrap();
            symlink("libcuda.so.999.0.0", compat.join("libcuda.so.1")).unwrap();
        },
        Some("it holds no regular file libcuda.so.<version>"),
    );
}

#[test]
fn a_compat_libcuda_whose_version_does_not_parse_is_not_used() {
    hostile(
        |cuda, _| {
            let compat = cuda.join("compat");
            fs::create_dir(&compat).unwrap();
            fs::write(compat.join("libcuda.so.999.x"), b"not even ELF").unwrap();
            symlink("libcuda.so.999.x", compat.join("libcuda.so.1")).unwrap();
        },
        Some("libcuda.so.999.x: not a driver version"),
    );
}

/// scripts/gpu-node-check.sh's compat check (issue 17 §5) run from a kit made of this build,
/// on the simulated node as a real H100 host has it (driver 580.159.03, and
/// `/usr/local/cuda-13.0/compat` holding compat driver 580.95.05: the host's libcuda must
/// load), and on an older node, where the compat one must.
#[test]
fn gpu_node_check_reports_the_compat_choice() {
    require_root();
    let kit = tempfile::tempdir().expect("temp dir");
    let kit = kit.path();
    gpu_kit::make(kit, glibc_image());
    let host_compat = kit.join("host/cuda-13.0/compat");
    fs::create_dir_all(host_compat.parent().unwrap()).unwrap();
    gpu_kit::copy(
        &compat_image()
            .rootfs()
            .join(CUDA_COMPAT_DIR.trim_start_matches('/')),
        &host_compat,
    );

    for (host, why, file) in [
        (
            NEWER_HOST,
            format!(
                "CUDA compat: host driver {NEWER_HOST} is the same or newer than compat {COMPAT_VERSION}: the host's libraries in /usr/local/cuda/compat"
            ),
            format!("{LIB64}/libcuda.so.{NEWER_HOST}"),
        ),
        (
            OLDER_HOST,
            format!(
                "CUDA compat: compat {COMPAT_VERSION} is newer than host driver {OLDER_HOST}: the compat libraries in /usr/local/cuda/compat"
            ),
            format!("/usr/local/cuda/compat/libcuda.so.{COMPAT_VERSION}"),
        ),
    ] {
        let node = node(host);
        let out = kit.join(format!("out-{host}"));
        let compat_dirs = host_compat.to_str().expect("UTF-8 path");
        let run = gpu_kit::run(kit, "compat", &out, &node, &[("COMPAT_DIRS", compat_dirs)]);
        let stdout = String::from_utf8_lossy(&run.stdout);
        let report = gpu_kit::report(&run, &out, &["compat.log"]);
        assert!(run.status.success(), "{report}");
        for line in [
            format!(
                "== CUDA compat: {} (libcuda.so.{COMPAT_VERSION} )",
                host_compat.display()
            ),
            why,
            format!("dlopen libcuda.so.1 file {file}"),
        ] {
            assert!(
                stdout.lines().any(|l| l == line),
                "missing {line:?}\n{report}"
            );
        }
    }
}
