//! Every kind of image (issue 17 §4), end to end with real runc and the prestart hook on a
//! simulated node: distroless (no shell, no loader cache, no ldconfig), a read-only rootfs,
//! RHEL's /usr/lib64 layout, an image with an older driver's libcuda on its loader path,
//! an Alpine/musl image, and an image whose loader cache is in glibc's new format only. In
//! each, a real program (`/gpucheck`, built for the image's libc) dlopens `libcuda.so.1` by
//! name with no LD_LIBRARY_PATH and calls cuInit: 0 is the host driver's answer, 999 the
//! answer of any libcuda the image brought itself. And through a static CDI spec (Podman),
//! an image without a loader cache on a node whose driver lives in GKE's directory.
//! Run as root after `cargo build --workspace`: `cargo test --test images_e2e`.

use std::fs;
use std::path::Path;
use std::sync::OnceLock;

use nvhook_test_support::engines::unique_name;
use nvhook_test_support::podman::{CdiSpecFile, Podman};
use nvhook_test_support::{
    Bundle, GlibcImageOptions, Image, LoaderCache, OLD_DRIVER_VERSION, Output, RuntimeEnv, SimNode,
    build_glibc_image, build_musl_image, glibc_image, glibc_image_with_fake_libcuda, require_root,
    run_clean, run_nvhook, target_tmp_dir,
};

const GPUS: u32 = 2;

/// An image built once per test binary, in a directory of its own.
fn image(name: &str, build: impl FnOnce(&Path) -> Image) -> Image {
    let dir = target_tmp_dir().join(format!("images-e2e-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create image dir");
    build(&dir)
}

fn glibc(name: &str, options: GlibcImageOptions) -> Image {
    image(name, |dir| build_glibc_image(dir, options))
}

/// GPU 1 asked for; the checks `extra` after gpucheck's own.
fn start(image: &Image, extra: &[&str], edit: impl FnOnce(&mut Bundle)) -> (SimNode, Output) {
    let node = SimNode::create(GPUS);
    let mut args = vec![
        "/gpucheck",
        "--dev",
        "/dev/nvidia1",
        "--dev",
        "/dev/nvidia0",
    ];
    args.extend(extra);
    let mut bundle = Bundle::new(image, &args);
    bundle.env("NVIDIA_VISIBLE_DEVICES=1");
    edit(&mut bundle);
    bundle.prestart_hook(&node);
    let output = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV1);
    (node, output)
}

/// GPU 1 usable, GPU 0 absent, and the host's libcuda loaded by name.
#[track_caller]
fn assert_host_driver(output: &Output) {
    output.assert_success();
    output.assert_lines(&[
        "dev /dev/nvidia1 ENXIO",
        "dev /dev/nvidia0 absent",
        "dlopen libcuda.so.1 ok",
        "cuInit 0",
    ]);
}

#[test]
fn a_distroless_image_with_no_shell_no_loader_cache_and_no_ldconfig() {
    let image = glibc(
        "distroless",
        GlibcImageOptions {
            ldcache: LoaderCache::Absent,
            ..GlibcImageOptions::default()
        },
    );
    let root = image.rootfs();
    for absent in ["etc/ld.so.cache", "sbin/ldconfig", "bin/sh", "usr/bin/sh"] {
        assert!(!root.join(absent).exists(), "the image has {absent}");
    }
    let (_node, output) = start(&image, &["--ls", "/etc"], |_| {});
    assert_host_driver(&output);
}

#[test]
fn a_read_only_rootfs() {
    let (_node, output) = start(glibc_image(), &["--write", "/etc/ld.so.cache"], |b| {
        b.readonly_root();
    });
    assert_host_driver(&output);
    // runc made the rootfs read-only after the hooks: the image stays read-only to the
    // container, nvhook's changes included.
    output.assert_lines(&["write /etc/ld.so.cache EROFS"]);
}

#[test]
fn a_rhel_image_with_usr_lib64() {
    let image = glibc(
        "rhel",
        GlibcImageOptions {
            rhel: true,
            ..GlibcImageOptions::default()
        },
    );
    assert!(!image.rootfs().join("etc/debian_version").exists());
    let (_node, output) = start(&image, &["--stat", "/usr/lib64/libcuda.so.1"], |_| {});
    assert_host_driver(&output);
    output.assert_lines(&["stat /usr/lib64/libcuda.so.1 file 0:0"]);
}

#[test]
fn an_older_drivers_libcuda_on_the_images_loader_path_loses_to_the_hosts() {
    let image = glibc(
        "old-driver",
        GlibcImageOptions {
            old_driver_libcuda: true,
            ..GlibcImageOptions::default()
        },
    );
    let lib_dir = "/usr/lib/x86_64-linux-gnu";
    let (node, output) = start(&image, &["--ls", lib_dir], |_| {});
    assert_host_driver(&output);
    // Both are there; the name the loader resolves leads to the host's.
    output.assert_lines(&[
        &format!("ls {lib_dir} libcuda.so.{OLD_DRIVER_VERSION}"),
        &format!("ls {lib_dir} libcuda.so.{}", node.driver_version()),
    ]);
}

/// Alpine/musl: nvhook gives the device nodes and the driver's files, in `/usr/lib`, which
/// is on musl's default search path, and writes no loader configuration (musl reads no
/// ld.so.cache). The driver's libraries are glibc's: a program that needs glibc symbols they
/// lack needs the image's gcompat; these libraries load under musl as they are.
#[test]
fn an_alpine_musl_image_gets_the_driver_in_usr_lib() {
    let image = image("musl", build_musl_image);
    let (_node, output) = start(
        &image,
        &[
            "--stat",
            "/usr/lib/libcuda.so.1",
            "--stat",
            "/etc/ld.so.cache",
        ],
        |_| {},
    );
    assert_host_driver(&output);
    output.assert_lines(&[
        "stat /usr/lib/libcuda.so.1 file 0:0",
        "stat /etc/ld.so.cache absent",
    ]);
}

#[test]
fn an_image_whose_loader_cache_is_in_the_new_format_only() {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    let image = IMAGE.get_or_init(|| {
        glibc(
            "new-cache",
            GlibcImageOptions {
                ldcache: LoaderCache::NewFormatOnly,
                ..GlibcImageOptions::default()
            },
        )
    });
    let cache = fs::read(image.rootfs().join("etc/ld.so.cache")).expect("read the cache");
    assert!(
        cache.starts_with(b"glibc-ld.so.cache1.1"),
        "not a new-format-only cache"
    );
    let (_node, output) = start(image, &[], |_| {});
    assert_host_driver(&output);
}

/// The cuInit-unknown class (issue 25 §5): an image whose `LD_LIBRARY_PATH` leads the loader
/// to a libcuda.so.1 of its own (a stale copy, a stub made loadable) before the cache where
/// nvhook lists the host's. The real loader takes the image's (cuInit 999 here, the fake's
/// answer); `nvhook plan` names the file and the directory, and once the directory is off
/// `LD_LIBRARY_PATH` the host's loads and the warning is gone.
#[test]
fn an_images_libcuda_on_ld_library_path_is_named_by_nvhook_plan() {
    let stale = "/opt/stale";
    let warning = format!(
        "Warning: the image's own {stale}/libcuda.so.1 is loaded instead of the host's libcuda: LD_LIBRARY_PATH lists {stale}"
    );
    for (ld_library_path, shadowed) in [
        (format!("/usr/local/nvidia/lib64:{stale}/"), true),
        ("/usr/local/nvidia/lib64".to_string(), false),
    ] {
        let node = SimNode::create(GPUS);
        let mut bundle = Bundle::new(glibc_image(), &["/gpucheck"]);
        let dir = bundle.rootfs().join(stale.trim_start_matches('/'));
        fs::create_dir_all(&dir).expect("make the image's directory");
        let fake = glibc_image_with_fake_libcuda()
            .rootfs()
            .join("usr/lib/x86_64-linux-gnu/libcuda.so.1");
        fs::copy(fake, dir.join("libcuda.so.1")).expect("the image's own libcuda");
        bundle
            .env("NVIDIA_VISIBLE_DEVICES=1")
            .env(&format!("LD_LIBRARY_PATH={ld_library_path}"))
            .prestart_hook(&node);
        // The plan of the bundle, as an operator asks for it before the start.
        bundle.write_config();
        let config = node.config();
        let bundle_dir = bundle.dir().to_str().expect("UTF-8 path");
        let plan = run_nvhook(&[
            "--config",
            config.to_str().expect("UTF-8 path"),
            "plan",
            "--bundle",
            bundle_dir,
        ]);
        let text = String::from_utf8_lossy(&plan.stdout);
        assert!(
            plan.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&plan.stderr)
        );
        assert_eq!(text.contains(&warning), shadowed, "{text}");
        // What the real loader does with it.
        let output = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV1);
        output.assert_success();
        let cuinit = if shadowed { "cuInit 999" } else { "cuInit 0" };
        output.assert_lines(&["dlopen libcuda.so.1 ok", cuinit]);
    }
}

/// A static CDI spec keeps the driver's libraries at their host paths: on a node whose driver
/// lives where GKE installs it (`/usr/local/nvidia/lib64`), that is a directory the loader of
/// an image without a cache never searches. The spec's createRuntime hook then writes the
/// image a cache of its own, as NVIDIA's update-ldcache hook does (found on a real H200 node
/// of that layout, where the CDI route left such a container without libcuda).
#[test]
fn a_static_cdi_spec_on_a_gke_layout_node_reaches_an_image_without_a_loader_cache() {
    require_root();
    let node = SimNode::create_with(GPUS, &["--lib-dir", "usr/local/nvidia/lib64"]);
    let spec = CdiSpecFile::new("json");
    node.generate_cdi_spec(spec.path());
    let image = glibc(
        "distroless-cdi",
        GlibcImageOptions {
            ldcache: LoaderCache::Absent,
            ..GlibcImageOptions::default()
        },
    );
    let podman = Podman::new();
    let name = format!("localhost/{}:latest", unique_name("nvhook-no-cache"));
    podman.import(image.rootfs(), &name);
    let args = [
        "/gpucheck",
        "--dev",
        "/dev/nvidia1",
        "--dev",
        "/dev/nvidia0",
    ];
    let mut output = podman.run(&["--device", "nvidia.com/gpu=1"], &name, &args);
    output.hook_log = Some(node.log());
    assert_host_driver(&output);
    let file = format!(
        "dlopen libcuda.so.1 file /usr/local/nvidia/lib64/libcuda.so.{}",
        node.driver_version()
    );
    output.assert_lines(&[file.as_str()]);
    let log = node.log();
    assert!(
        log.contains("the image has no loader cache, and its loader does not look where the driver's libraries are: writing one"),
        "{log}"
    );
}
