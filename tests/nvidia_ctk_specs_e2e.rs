//! CDI specs written by NVIDIA's own `nvidia-ctk cdi generate` (v1.20.0, run on the simulated
//! node: tests/fixtures/nvidia-ctk/README.md has the commands) run with nvhook linked as
//! `nvidia-cdi-hook`, the only hook program on the node (issue 25 §3): an operator who removes
//! NVIDIA's toolkit keeps the specs its device plugin and DRA driver wrote. The container must
//! see what it sees with nvhook's own spec for the same GPU: every file of its tree (kind, mode,
//! owner, size, link target, device numbers, content) and its loader cache, entry by entry.
//! Real Podman and runc. Run as root after `cargo build --workspace`.

use nvhook_test_support as support;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use support::containerd2::{Containerd2Cri, DEFAULT_HANDLER};
use support::cri::{ContainerRequest, Cri};
use support::engines::{CgroupParent, ContainerdBuild, EngineDir, ImageConfig, unique_name};
use support::podman::{CdiSpecFile, Podman};
use support::{SimNode, glibc_image, nvhook_bin, require_program, require_root};

const GPUS: u32 = 4;
/// The driver version the fixtures were generated for (their library names carry it).
const FIXTURE_DRIVER: &str = "550.54.15";

/// Prints the container's whole tree but the kernel's filesystems: `stat` of every path, the
/// md5 of every regular file, and its loader cache in hex, each after a marker line.
const LIST: &str = r#"B=/usr/bin/busybox
skip='( -path /proc -o -path /sys ) -prune -o'
echo '== tree'
$B find / $skip -print | $B sort | while read -r f; do
  $B stat -c '%N %F %a %u:%g %s %t:%T' "$f"
done
echo '== sums'
$B find / $skip -type f -print | $B sort | $B xargs $B md5sum
echo '== cache'
$B hexdump -v -e '/1 "%02x"' /etc/ld.so.cache
echo
echo '== profile'
$B cat /etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf 2>/dev/null
echo"#;

/// Where NVIDIA's `update-application-profile` (and nvhook under its name) writes the driver's
/// application profile: NVIDIA's specs only, so left out of the comparison and checked apart.
const PROFILE_DIR: &str = "/etc/nvidia";

/// Files the engine writes per container (its name, hostname, resolver): they differ between
/// any two runs, whatever the spec.
const PER_CONTAINER: &[&str] = &[
    "/etc/hostname",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/run/.containerenv",
];

/// NVIDIA's specs carry no 32-bit libraries (nvidia-ctk 1.20 has no compat32): nvhook's own,
/// for the same files, is made for the capabilities they serve.
const SAME_CAPABILITIES: &str =
    r#"supported-capabilities = ["compute", "utility", "video", "graphics", "display", "ngx"]"#;

/// The tests' glibc image with busybox for [`LIST`], under `dir`.
fn listing_image(dir: &Path) -> std::path::PathBuf {
    let rootfs = glibc_image().instantiate(dir);
    fs::copy(require_program("busybox"), rootfs.join("usr/bin/busybox")).expect("busybox");
    rootfs
}

/// A [`LIST`] line without a directory's size, which is its filesystem's own: a directory
/// made in the container's layer and one on a tmpfs nvhook's hook made hold the same entries.
fn without_directory_size(line: &str) -> String {
    let fields: Vec<&str> = line.split(' ').collect();
    match fields.iter().position(|f| *f == "directory") {
        Some(at) if fields.len() == at + 5 => {
            let mut kept = fields.clone();
            kept.remove(at + 3);
            kept.join(" ")
        }
        _ => line.to_string(),
    }
}

/// What one container saw.
struct Seen {
    tree: BTreeSet<String>,
    cache: BTreeSet<String>,
    /// The application profile, if one was written.
    profile: Option<String>,
}

fn fixture(name: &str, node: &SimNode, hook: &Path) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nvidia-ctk")
        .join(name);
    fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .replace("@NODE@", &node.root().display().to_string())
        .replace("@HOOK@", &hook.display().to_string())
}

/// Runs [`LIST`] in a container given `device` by the spec `spec_text` (installed where
/// Podman reads specs, alone under its kind, removed after).
fn seen_through_podman(podman: &Podman, image: &str, spec_text: &str, device: &str) -> Seen {
    Seen::read(&through_podman(
        podman,
        image,
        spec_text,
        device,
        &["/usr/bin/busybox", "sh", "-c", LIST],
    ))
}

/// The standard output of `args` in a container given `device` by the spec `spec_text`.
fn through_podman(
    podman: &Podman,
    image: &str,
    spec_text: &str,
    device: &str,
    args: &[&str],
) -> String {
    let spec = CdiSpecFile::new("yaml");
    fs::write(spec.path(), spec_text).expect("install the spec");
    let output = podman.run(&["--device", device], image, args);
    output.assert_success();
    output.stdout
}

/// [`seen_through_podman`] through containerd 2.1's CDI.
fn seen_through_containerd(rootfs: &Path, spec_text: &str, device: &str) -> Seen {
    Seen::read(&through_containerd(
        rootfs,
        spec_text,
        device,
        &["/usr/bin/busybox", "sh", "-c", LIST],
    ))
}

/// [`through_podman`] through containerd 2.1's CDI (Debian sid's, a fresh one with its own
/// state and the spec alone in its spec directory): a CRI pod whose container the kubelet
/// gave `device` (`CDIDevices`), run by runc.
fn through_containerd(rootfs: &Path, spec_text: &str, device: &str, args: &[&str]) -> String {
    let dir = EngineDir::new("ctrd2-nvidia-ctk");
    let setup = Containerd2Cri::under(dir.path());
    fs::create_dir_all(&setup.cdi_spec_dirs[0]).expect("create the CDI spec dir");
    fs::write(setup.cdi_spec_dirs[0].join("nvidia.yaml"), spec_text).expect("write the spec");
    let containerd = setup.start(dir.path(), &[]);
    let image = format!("docker.io/nvhook-test/{}:latest", unique_name("glibc"));
    let shell = ImageConfig {
        cmd: &["/usr/bin/busybox", "sh"],
        env: &[],
    };
    containerd.import_rootfs(dir.path(), rootfs, &image, &shell);
    let mut cri = Cri::connect(containerd.socket());
    let cgroups = CgroupParent::new("nvhook-nvidia-ctk");
    let run = cri.run_pod(
        &unique_name("listing"),
        DEFAULT_HANDLER,
        &cgroups.path(),
        &dir.path().join("pods"),
        &ContainerRequest {
            image: &image,
            args,
            cdi_devices: &[device],
            ..Default::default()
        },
    );
    let mut output = run.output;
    output.hook_log = Some(format!("(containerd log)\n{}", containerd.log()));
    output.assert_success();
    drop(cri);
    containerd.stop_leaving_nothing(dir.path());
    output.stdout
}

impl Seen {
    /// [`LIST`]'s output, less the files each container has its own of.
    fn read(stdout: &str) -> Seen {
        let section = |name: &str| {
            let marker = format!("== {name}");
            stdout
                .lines()
                .skip_while(move |l| *l != marker)
                .skip(1)
                .take_while(|l| !l.starts_with("== "))
        };
        let per_container = |line: &&str| {
            !PER_CONTAINER
                .iter()
                .any(|p| line.starts_with(&format!("{p} ")) || line.ends_with(&format!("  {p}")))
                && !line.starts_with(&format!("{PROFILE_DIR} "))
                && !line.starts_with(&format!("{PROFILE_DIR}/"))
                && !line.contains(&format!("  {PROFILE_DIR}/"))
        };
        let tree = section("tree")
            .chain(section("sums"))
            .filter(per_container)
            .map(without_directory_size)
            .collect();
        let hex = section("cache").next().expect("the cache in hex");
        // The set compares the entries; the header only counts them.
        let cache = support::ld_cache_entries_of_hex(hex).into_iter().collect();
        let profile = section("profile").next().map(String::from);
        Seen {
            tree,
            cache,
            profile,
        }
    }

    /// Asserts that the container is not an empty one: exactly `gpus` of the node's nodes,
    /// libcuda in the loader cache, and (NVIDIA's `update-application-profile`) EGL and Vulkan
    /// limited to those GPUs (the simulated node's minors are the indexes).
    #[track_caller]
    fn assert_given(&self, gpus: &[u32], what: &str) {
        let mask: u64 = gpus.iter().map(|g| 1 << g).sum();
        assert_eq!(
            self.profile.as_deref(),
            Some(
                format!(r#"{{"profiles":[{{"name":"_container_","settings":["EGLVisibleDGPUDevices",{mask:#x}]}}],"rules":[{{"pattern":[],"profile":"_container_"}}]}}"#)
                    .as_str()
            ),
            "{what}: the application profile"
        );
        for gpu in 0..GPUS {
            let node_line = format!("/dev/nvidia{gpu} character special file ");
            let given = self.tree.iter().any(|l| l.starts_with(&node_line));
            assert_eq!(given, gpus.contains(&gpu), "{what}: /dev/nvidia{gpu}");
        }
        assert!(
            self.cache
                .iter()
                .any(|l| l.starts_with("libcuda.so.1 (libc6,x86-64) => ")),
            "{what}: {:#?}",
            self.cache
        );
    }
}

#[track_caller]
fn assert_same(theirs: &Seen, ours: &Seen, what: &str) {
    let only = |a: &BTreeSet<String>, b: &BTreeSet<String>| -> Vec<String> {
        a.difference(b).cloned().collect()
    };
    let tree = (
        only(&theirs.tree, &ours.tree),
        only(&ours.tree, &theirs.tree),
    );
    let cache = (
        only(&theirs.cache, &ours.cache),
        only(&ours.cache, &theirs.cache),
    );
    assert!(
        tree.0.is_empty() && tree.1.is_empty() && cache.0.is_empty() && cache.1.is_empty(),
        "{what}: the container differs\nonly with NVIDIA's spec: {:#?}\nonly with nvhook's: {:#?}\ncache only with NVIDIA's: {:#?}\ncache only with nvhook's: {:#?}",
        tree.0,
        tree.1,
        cache.0,
        cache.1
    );
}

#[test]
fn nvidia_ctk_specs_run_with_nvhook_as_nvidia_cdi_hook_and_match_nvhooks_own() {
    require_root();
    let node = SimNode::create(GPUS);
    assert_eq!(node.driver_version(), FIXTURE_DRIVER);
    let dir = EngineDir::new("nvidia-ctk-specs");
    let hook = dir.path().join("nvidia-cdi-hook");
    std::os::unix::fs::symlink(nvhook_bin(), &hook).expect("link nvidia-cdi-hook");
    let rootfs = listing_image(dir.path());
    let podman = Podman::new();
    let image = format!("localhost/{}:latest", unique_name("nvhook-nvidia-ctk"));
    podman.import(&rootfs, &image);

    let ours_text = {
        node.configure(SAME_CAPABILITIES);
        let spec = dir.path().join("nvhook.yaml");
        node.generate_cdi_spec(&spec);
        fs::read_to_string(&spec).expect("nvhook's spec")
    };
    let uuid_2 = format!("nvidia.com/gpu={}", node.gpu_uuid(2));
    for (fixture_name, device, ours_device, gpus) in [
        (
            "nvml-index.yaml",
            "nvidia.com/gpu=1",
            "nvidia.com/gpu=1",
            &[1][..],
        ),
        (
            "nvml-index.yaml",
            "nvidia.com/gpu=all",
            "nvidia.com/gpu=all",
            &[0, 1, 2, 3],
        ),
        ("nvml-uuid.yaml", &uuid_2, "nvidia.com/gpu=2", &[2]),
        ("default.yaml", "nvidia.com/gpu=3", "nvidia.com/gpu=3", &[3]),
    ] {
        let what = format!("{fixture_name} {device}");
        let theirs = seen_through_podman(
            &podman,
            &image,
            &fixture(fixture_name, &node, &hook),
            device,
        );
        theirs.assert_given(gpus, &what);
        let ours = seen_through_podman(&podman, &image, &ours_text, ours_device);
        assert_same(&theirs, &ours, &what);
    }
}

/// NVIDIA's spec through containerd 2.1.9's own CDI support (the device plugin's `cdi-cri`
/// strategy: the kubelet passes the CDI device name, containerd applies the spec, runc runs
/// its hooks), against nvhook's own spec through the same.
#[test]
fn an_nvidia_ctk_spec_runs_through_containerd_2_cdi_and_matches_nvhooks_own() {
    require_root();
    let build = ContainerdBuild::sid();
    eprintln!("containerd from Debian sid: {}", build.version());
    let node = SimNode::create(GPUS);
    assert_eq!(node.driver_version(), FIXTURE_DRIVER);
    let dir = EngineDir::new("nvidia-ctk-ctrd2");
    let hook = dir.path().join("nvidia-cdi-hook");
    std::os::unix::fs::symlink(nvhook_bin(), &hook).expect("link nvidia-cdi-hook");
    let rootfs = listing_image(dir.path());
    let ours = {
        node.configure(SAME_CAPABILITIES);
        let spec = dir.path().join("nvhook.yaml");
        node.generate_cdi_spec(&spec);
        fs::read_to_string(&spec).expect("nvhook's spec")
    };
    let what = "nvml-index.yaml nvidia.com/gpu=1 through containerd 2.1";
    let theirs = seen_through_containerd(
        &rootfs,
        &fixture("nvml-index.yaml", &node, &hook),
        "nvidia.com/gpu=1",
    );
    theirs.assert_given(&[1], what);
    let ours = seen_through_containerd(&rootfs, &ours, "nvidia.com/gpu=1");
    assert_same(&theirs, &ours, what);
}

/// NVIDIA's specs run `enable-cuda-compat --host-driver-version=550.54.15` and `update-ldcache`
/// as two hooks of their own: the first lists the image's compat directory in an ld.so.conf.d
/// file when NVIDIA's rule says it serves the host (a newer major, without the ELF note), the
/// second puts that directory's libraries first in the cache. With nvhook as `nvidia-cdi-hook`
/// the loader must then take the image's compat libcuda where the compat driver is newer, and
/// the host's where it is older or where the image's `/etc/ld.so.conf` does not include
/// ld.so.conf.d (NVIDIA's ldconfig reads no compat file there), through Podman and through
/// containerd 2.1's CDI. The spec also
/// carries a hook of a newer toolkit (`apply-cuda-memory-limits`, after 1.20): a warning, never
/// a failed start.
#[test]
fn forward_compat_through_nvidias_spec_as_nvidia_writes_it() {
    require_root();
    let node = SimNode::create(GPUS);
    assert_eq!(node.driver_version(), FIXTURE_DRIVER);
    let dir = EngineDir::new("nvidia-ctk-compat");
    let hook = dir.path().join("nvidia-cdi-hook");
    std::os::unix::fs::symlink(nvhook_bin(), &hook).expect("link nvidia-cdi-hook");
    let newer_hook = format!(
        "    hooks:\n        - hookName: createContainer\n          path: {}\n          args:\n            - nvidia-cdi-hook\n            - apply-cuda-memory-limits\n            - --driver-root\n            - /\n            - --gpu-id\n            - {}\n",
        hook.display(),
        node.gpu_uuid(1)
    );
    let spec = fixture("nvml-index.yaml", &node, &hook).replacen("    hooks:\n", &newer_hook, 1);
    assert!(spec.contains("apply-cuda-memory-limits"));
    let podman = Podman::new();
    let lib64 = "/usr/lib/x86_64-linux-gnu";
    // CUDA images (Ubuntu's) have /etc/ld.so.conf include /etc/ld.so.conf.d, where
    // enable-cuda-compat's file goes; an image whose ld.so.conf does not include it keeps the
    // host's libraries with NVIDIA's ldconfig, and so with nvhook.
    let include = "include /etc/ld.so.conf.d/*.conf\n/usr/lib/x86_64-linux-gnu\n";
    let without = "/usr/lib/x86_64-linux-gnu\n";
    // (compat driver, the image's ld.so.conf, the loader takes the compat libcuda, the
    // enable-cuda-compat hook wrote its file)
    for (compat, ld_so_conf, used, listed) in [
        ("580.95.05", include, true, true),
        ("535.104.05", include, false, false),
        ("580.95.05", without, false, true),
    ] {
        let image_dir = dir.path().join(unique_name(compat));
        fs::create_dir_all(image_dir.join("build")).expect("mkdir");
        let rootfs = support::build_glibc_image(
            &image_dir.join("build"),
            support::GlibcImageOptions {
                cuda_compat: Some(compat),
                ..support::GlibcImageOptions::default()
            },
        )
        .instantiate(&image_dir);
        fs::write(rootfs.join("etc/ld.so.conf"), ld_so_conf).expect("write ld.so.conf");
        let compat = format!("{compat} (ld.so.conf {ld_so_conf:?})");
        let want: Vec<String> = if used {
            vec![
                "cuInit 999".into(),
                // The directory as NVIDIA's hook lists it: its links resolved in the image.
                format!(
                    "dlopen libcuda.so.1 path {}/libcuda.so.1",
                    support::CUDA_COMPAT_DIR
                ),
                format!(
                    "dlopen libcuda.so.1 file {}/libcuda.so.580.95.05",
                    support::CUDA_COMPAT_DIR
                ),
                "stat /etc/ld.so.conf.d/00-compat-nvhook.conf file 0:0".into(),
            ]
        } else {
            vec![
                "cuInit 0".into(),
                format!("dlopen libcuda.so.1 path {lib64}/libcuda.so.1"),
                format!("dlopen libcuda.so.1 file {lib64}/libcuda.so.{FIXTURE_DRIVER}"),
                if listed {
                    "stat /etc/ld.so.conf.d/00-compat-nvhook.conf file 0:0".into()
                } else {
                    "stat /etc/ld.so.conf.d/00-compat-nvhook.conf absent".into()
                },
            ]
        };
        let args = [
            "/gpucheck",
            "--stat",
            "/etc/ld.so.conf.d/00-compat-nvhook.conf",
        ];
        let image = format!("localhost/{}:latest", unique_name("nvhook-compat"));
        podman.import(&rootfs, &image);
        let through = [
            (
                "Podman",
                through_podman(&podman, &image, &spec, "nvidia.com/gpu=1", &args),
            ),
            (
                "containerd 2.1",
                through_containerd(&rootfs, &spec, "nvidia.com/gpu=1", &args),
            ),
        ];
        for (engine, stdout) in through {
            for line in &want {
                assert!(
                    stdout.lines().any(|l| l == line),
                    "compat {compat} through {engine}: no {line:?} in\n{stdout}"
                );
            }
        }
    }
}
