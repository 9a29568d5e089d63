//! nvhook as NVIDIA's `nvidia-cdi-hook`, against NVIDIA's own (v1.20.0): containers started
//! through NVIDIA's CDI spec (`tests/fixtures/nvidia-ctk/nvml-index.yaml`, device
//! `nvidia.com/gpu=1`) by Podman and runc on a simulated node, with the tests' plain glibc image
//! and CUDA forward-compat images (compat libcuda 580.95.05, newer than the node's driver
//! 550.54.15, and 535.104.05, older; the newer one again with an ld.so.conf that reads
//! ld.so.conf.d). What NVIDIA's hook gave them is recorded in
//! `tests/fixtures/nvidia-hook-containers/<image>.txt` by `scripts/nvidia-hook-containers.sh`
//! (NVIDIA's binary cannot be built without the network). This test runs the same containers
//! with nvhook linked as `nvidia-cdi-hook` and compares: the loader-cache entries of the
//! driver's and the compat libraries (per SONAME, its paths in the cache's order; and the
//! entries both have, in the same order), the NVIDIA-related part of the tree (links,
//! ld.so.conf.d, the application profile, modes, owners), those files' lines, and which
//! libcuda the image's loader takes (`/gpucheck`). Each way nvhook differs is listed in
//! [`KNOWN_DIFFERENCES`] (each on purpose, with why); any other
//! difference, or a listed one no longer seen, fails. The host keeps nothing: no new mount of
//! the node or of Podman's storage and bundles, no change to the host's loader files or to
//! the node's driver files. nvhook's containers are left, in the fixtures' format, in
//! `target/tmp/nvidia-hook-containers/` for `diff`.
//! Real Podman and runc. Run as root after `cargo build --workspace`.

use nvhook_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use support::engines::{EngineDir, unique_name};
use support::podman::{CdiSpecFile, Podman};
use support::{
    SimNode, Snapshot, host_mounts_referencing, host_snapshot, nvhook_bin, require_program,
    require_root,
};

const GPUS: u32 = 4;
/// The driver version the nvidia-ctk fixtures were generated for (their library names carry it).
const FIXTURE_DRIVER: &str = "550.54.15";
const SPEC: &str = "nvml-index.yaml";
const DEVICE: &str = "nvidia.com/gpu=1";

/// One of the images, by the name of its fixture.
struct ImageKind {
    name: &'static str,
    /// [`support::GlibcImageOptions::cuda_compat`].
    cuda_compat: Option<&'static str>,
    /// `/etc/ld.so.conf` includes `/etc/ld.so.conf.d/*.conf` (as Ubuntu's, and so
    /// `nvidia/cuda`'s, does): the tests' image lists its library directory alone, and then
    /// ldconfig reads no file of ld.so.conf.d.
    conf_d: bool,
}

/// The tests' plain glibc image, two with CUDA forward-compat libraries in
/// [`support::CUDA_COMPAT_DIR`] (one newer than the node's driver, one older), and the newer
/// one again with an `/etc/ld.so.conf` that reads ld.so.conf.d.
const IMAGES: &[ImageKind] = &[
    ImageKind {
        name: "glibc",
        cuda_compat: None,
        conf_d: false,
    },
    ImageKind {
        name: "cuda-compat-580.95.05",
        cuda_compat: Some("580.95.05"),
        conf_d: false,
    },
    ImageKind {
        name: "cuda-compat-535.104.05",
        cuda_compat: Some("535.104.05"),
        conf_d: false,
    },
    ImageKind {
        name: "cuda-compat-580.95.05-conf-d",
        cuda_compat: Some("580.95.05"),
        conf_d: true,
    },
];

/// What [`ImageKind::conf_d`] images have in `/etc/ld.so.conf`.
const LD_SO_CONF_WITH_CONF_D: &str =
    "include /etc/ld.so.conf.d/*.conf\n/usr/lib/x86_64-linux-gnu\n";

/// The listing each container runs (busybox sh), shared with the fixture script.
const LIST: &str = include_str!("fixtures/nvidia-hook-containers/list.sh");

/// Names that make a loader-cache entry one of the driver's or the compat libraries.
const NVIDIA_NAMES: &[&str] = &["nvidia", "cuda", "nvcuvid", "nvoptix"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    /// `SONAME (flags) => PATH, PATH...`: the cache's entries for one SONAME of the driver's
    /// or the compat libraries, in the cache's order (which one the loader takes first).
    Cache,
    /// `stat` of an NVIDIA-related path (see list.sh).
    Tree,
    /// `FILE: LINE` of /etc/ld.so.conf, /etc/ld.so.conf.d/* and /etc/nvidia/**.
    Files,
    /// /gpucheck's output: which libcuda.so.1 the image's loader takes, and its cuInit.
    Gpucheck,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Side {
    /// Seen with NVIDIA's `nvidia-cdi-hook`, not with nvhook.
    NvidiaOnly,
    /// Seen with nvhook as `nvidia-cdi-hook`, not with NVIDIA's.
    NvhookOnly,
}

/// One way nvhook's containers differ from NVIDIA's, for one cause.
enum Known {
    /// In the containers of `images`, `part` has the `nvidia` lines only with NVIDIA's hook and
    /// the `nvhook` lines only with nvhook (as the fixtures write them: NVIDIA's random names
    /// as `@UUID@` and `@N@`).
    Lines {
        images: &'static [&'static str],
        part: Part,
        nvidia: &'static [&'static str],
        nvhook: &'static [&'static str],
        why: &'static str,
    },
    /// In the loader caches of `images`, NVIDIA's names by the prefix `nvidia` the libraries
    /// nvhook's names by `nvhook`: NVIDIA's paths are compared with the prefix replaced (and
    /// the test fails if none has it).
    CacheDir {
        images: &'static [&'static str],
        nvidia: &'static str,
        nvhook: &'static str,
        why: &'static str,
    },
}

const ALL_IMAGES: &[&str] = &[
    "glibc",
    "cuda-compat-580.95.05",
    "cuda-compat-535.104.05",
    "cuda-compat-580.95.05-conf-d",
];
/// The images whose compat libcuda (580.95.05, no ELF note) serves driver 550.54.15 by NVIDIA's
/// rule (a newer major): `enable-cuda-compat` writes its conf file in them.
const COMPAT_SERVES: &[&str] = &["cuda-compat-580.95.05", "cuda-compat-580.95.05-conf-d"];

/// Every way nvhook's containers differ from NVIDIA's v1.20.0. The test fails on any other
/// difference, and on any of these no longer seen.
const KNOWN_DIFFERENCES: &[Known] = &[
    // NVIDIA's update-ldcache re-execs itself and mounts the host's ldconfig on a tmpfs at
    // /run/nvidia-ctk-hook/<uuid> in the rootfs, in a private mount namespace: the directories
    // stay in the image (docs/gpu-flags.md, update-ldcache). nvhook runs no ldconfig: nothing of the
    // image runs with host privileges. On purpose.
    Known::Lines {
        images: ALL_IMAGES,
        part: Part::Tree,
        nvidia: &[
            "/run/nvidia-ctk-hook directory 755 0:0 * 0:0",
            "/run/nvidia-ctk-hook/@UUID@ directory 755 0:0 * 0:0",
        ],
        nvhook: &[],
        why: "NVIDIA's ldconfig re-exec leaves its scratch directories in the rootfs",
    },
    // NVIDIA's update-ldcache lists the container's system directories in
    // zz-nvcr-<os.CreateTemp digits>.conf (and --folder directories that are not system ones in
    // 00-nvcr-*.conf: /usr/lib/x86_64-linux-gnu is one, so there is none). nvhook writes its
    // own 000-nvhook.conf instead, naming the --folder (it leaves out only glibc's /lib,
    // /usr/lib, /lib64, /usr/lib64), so that an ldconfig run later in the image keeps the
    // driver's libraries. On purpose.
    Known::Lines {
        images: ALL_IMAGES,
        part: Part::Tree,
        nvidia: &["/etc/ld.so.conf.d/zz-nvcr-@N@.conf regular file 644 0:0 62 0:0"],
        nvhook: &["/etc/ld.so.conf.d/000-nvhook.conf regular file 644 0:0 72 0:0"],
        why: "NVIDIA's zz-nvcr-*.conf, nvhook's 000-nvhook.conf",
    },
    Known::Lines {
        images: ALL_IMAGES,
        part: Part::Files,
        nvidia: &[
            "/etc/ld.so.conf.d/zz-nvcr-@N@.conf: /lib/x86_64-linux-gnu",
            "/etc/ld.so.conf.d/zz-nvcr-@N@.conf: /usr/lib/x86_64-linux-gnu",
            "/etc/ld.so.conf.d/zz-nvcr-@N@.conf: /lib",
            "/etc/ld.so.conf.d/zz-nvcr-@N@.conf: /usr/lib",
        ],
        nvhook: &[
            "/etc/ld.so.conf.d/000-nvhook.conf: # Written by nvhook: NVIDIA driver libraries.",
            "/etc/ld.so.conf.d/000-nvhook.conf: /usr/lib/x86_64-linux-gnu",
        ],
        why: "NVIDIA's zz-nvcr-*.conf, nvhook's 000-nvhook.conf: their lines",
    },
    // enable-cuda-compat's file: NVIDIA names it 00-compat-<uuid v4>.conf, a new one at every
    // start; nvhook's name is fixed (00-compat-nvhook.conf, replaced, never piled up) and it
    // starts with nvhook's comment line (which says "NVIDIA driver libraries" though the
    // directory is the image's compat one). The directory it names is the same. On purpose.
    Known::Lines {
        images: COMPAT_SERVES,
        part: Part::Tree,
        nvidia: &["/etc/ld.so.conf.d/00-compat-@UUID@.conf regular file 644 0:0 28 0:0"],
        nvhook: &["/etc/ld.so.conf.d/00-compat-nvhook.conf regular file 644 0:0 74 0:0"],
        why: "enable-cuda-compat's conf file: 00-compat-<uuid>.conf, 00-compat-nvhook.conf",
    },
    Known::Lines {
        images: COMPAT_SERVES,
        part: Part::Files,
        nvidia: &["/etc/ld.so.conf.d/00-compat-@UUID@.conf: /usr/local/cuda-12.9/compat"],
        nvhook: &[
            "/etc/ld.so.conf.d/00-compat-nvhook.conf: # Written by nvhook: NVIDIA driver libraries.",
            "/etc/ld.so.conf.d/00-compat-nvhook.conf: /usr/local/cuda-12.9/compat",
        ],
        why: "enable-cuda-compat's conf file: its lines",
    },
    // An image whose /etc/ld.so.conf reads ld.so.conf.d: NVIDIA's ldconfig reads zz-nvcr-*.conf
    // (`/lib/x86_64-linux-gnu` first) before the image's own line, and names every library of
    // the directory by that path, through the image's `/lib -> usr/lib` link. nvhook names
    // them as the spec's --folder does. The same files; the loader opens either path.
    Known::CacheDir {
        images: &["cuda-compat-580.95.05-conf-d"],
        nvidia: "/lib/x86_64-linux-gnu/",
        nvhook: "/usr/lib/x86_64-linux-gnu/",
        why: "NVIDIA's cache names the library directory through the image's /lib link",
    },
];

/// One line that differs in one image's container.
type Difference = (String, Part, Side, String);

/// What one container saw, normalized.
#[derive(Debug)]
struct Seen {
    parts: BTreeMap<Part, BTreeSet<String>>,
    /// The driver's and compat libraries' cache entries, in the cache's order.
    cache_order: Vec<String>,
    /// How many of those had a path renamed by [`Known::CacheDir`].
    renamed: usize,
}

/// The lines of `text` after `== NAME`, up to the next marker.
fn section<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let marker = format!("== {name}");
    text.lines()
        .skip_while(|l| *l != marker)
        .skip(1)
        .take_while(|l| !l.starts_with("== "))
        .collect()
}

impl Seen {
    /// The fixture format (`== cache`, `== tree`, `== files`, `== gpucheck`; cache lines as
    /// `ldconfig -p` prints them, tab removed, in the cache's order), with NVIDIA's cache
    /// paths under `dirs`' first prefixes renamed to the second.
    fn parse(text: &str, dirs: &[(&str, &str)]) -> Seen {
        let mut cache_order = Vec::new();
        let mut renamed = 0;
        // SONAME (flags) -> its paths, in the cache's order.
        let mut cache: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for line in section(text, "cache") {
            let (key, path) = line
                .split_once(" => ")
                .unwrap_or_else(|| panic!("not a cache line: {line:?}"));
            if !NVIDIA_NAMES
                .iter()
                .any(|n| key.contains(n) || path.contains(n))
            {
                continue;
            }
            let path = match dirs
                .iter()
                .find_map(|(from, to)| Some(format!("{to}{}", path.strip_prefix(from)?)))
            {
                Some(path) => {
                    renamed += 1;
                    path
                }
                None => path.to_string(),
            };
            cache_order.push(format!("{key} => {path}"));
            cache.entry(key).or_default().push(path);
        }
        let mut parts = BTreeMap::new();
        parts.insert(
            Part::Cache,
            cache
                .iter()
                .map(|(key, paths)| format!("{key} => {}", paths.join(", ")))
                .collect(),
        );
        parts.insert(
            Part::Tree,
            section(text, "tree").into_iter().map(tree_line).collect(),
        );
        for (part, name) in [(Part::Files, "files"), (Part::Gpucheck, "gpucheck")] {
            parts.insert(
                part,
                section(text, name).into_iter().map(String::from).collect(),
            );
        }
        Seen {
            parts,
            cache_order,
            renamed,
        }
    }
}

/// A tree line (`%N %F %a %u:%g %s %t:%T`) with the size of a directory, and of a regular file
/// outside /etc, as `*`: the hooks write only links, directories and files under /etc; the
/// other files are the driver's (mounted by Podman from the node, built with the workspace:
/// the mock libnvidia-ml changes with its code) and the image's (built with the host's cc),
/// and a directory's size is its filesystem's (the engine's storage under /tmp).
fn tree_line(line: &str) -> String {
    let fields: Vec<&str> = line.rsplitn(5, ' ').collect();
    let [devices, size, owner, mode, name_and_kind] = fields[..] else {
        panic!("not a tree line: {line:?}");
    };
    let size = if name_and_kind.ends_with(" directory")
        || (name_and_kind.ends_with(" regular file") && !name_and_kind.starts_with("/etc/"))
    {
        "*"
    } else {
        size
    };
    format!("{name_and_kind} {mode} {owner} {size} {devices}")
}

/// The container's stdout (from [`LIST`]) in the fixture format, as
/// scripts/nvidia-hook-containers.sh writes it: the cache decoded with the host's
/// `ldconfig -p -C`, the tree sorted, the node's path as `@NODE@`.
fn fixture_text(stdout: &str, node: &SimNode) -> String {
    let hex = section(stdout, "cache")
        .first()
        .copied()
        .expect("the cache in hex");
    let mut text = String::from("== cache\n");
    for line in support::ld_cache_entries_of_hex(hex) {
        text.push_str(&line);
        text.push('\n');
    }
    for name in ["tree", "files", "gpucheck"] {
        text.push_str(&format!("== {name}\n"));
        let mut lines = section(stdout, name);
        if name == "tree" {
            lines.sort();
        }
        for line in lines {
            text.push_str(line);
            text.push('\n');
        }
    }
    text.replace(&node.root().display().to_string(), "@NODE@")
}

/// The differences between NVIDIA's container and nvhook's.
fn differences(image: &str, theirs: &Seen, ours: &Seen) -> BTreeSet<Difference> {
    let mut found = BTreeSet::new();
    for (part, their_lines) in &theirs.parts {
        let our_lines = &ours.parts[part];
        for line in their_lines.difference(our_lines) {
            found.insert((image.to_string(), *part, Side::NvidiaOnly, line.clone()));
        }
        for line in our_lines.difference(their_lines) {
            found.insert((image.to_string(), *part, Side::NvhookOnly, line.clone()));
        }
    }
    found
}

/// [`KNOWN_DIFFERENCES`], flattened.
struct KnownSets {
    lines: BTreeSet<Difference>,
    /// Image -> (NVIDIA's directory, nvhook's) in its cache.
    dirs: BTreeMap<&'static str, Vec<(&'static str, &'static str)>>,
    /// Why each is, one line each.
    reasons: Vec<String>,
}

fn known_differences() -> KnownSets {
    let mut known = KnownSets {
        lines: BTreeSet::new(),
        dirs: BTreeMap::new(),
        reasons: Vec::new(),
    };
    for difference in KNOWN_DIFFERENCES {
        match difference {
            Known::Lines {
                images,
                part,
                nvidia,
                nvhook,
                why,
            } => {
                for image in *images {
                    for (side, lines) in [(Side::NvidiaOnly, nvidia), (Side::NvhookOnly, nvhook)] {
                        for line in *lines {
                            known
                                .lines
                                .insert((image.to_string(), *part, side, line.to_string()));
                        }
                    }
                }
                known.reasons.push(format!("{part:?} in {images:?}: {why}"));
            }
            Known::CacheDir {
                images,
                nvidia,
                nvhook,
                why,
            } => {
                for image in *images {
                    known.dirs.entry(image).or_default().push((nvidia, nvhook));
                }
                known.reasons.push(format!("Cache in {images:?}: {why}"));
            }
        }
    }
    known
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Builds `kind` under `dir` (`dir/rootfs`) as the tests' glibc images are, with busybox for
/// [`LIST`].
fn build_image(dir: &Path, kind: &ImageKind) -> PathBuf {
    fs::create_dir_all(dir).expect("image dir");
    let image = support::build_glibc_image(
        dir,
        support::GlibcImageOptions {
            cuda_compat: kind.cuda_compat,
            ..support::GlibcImageOptions::default()
        },
    );
    let rootfs = image.rootfs().to_path_buf();
    fs::copy(require_program("busybox"), rootfs.join("usr/bin/busybox")).expect("busybox");
    if kind.conf_d {
        // The image has no ld.so.conf.d files: its cache stays as ldconfig wrote it.
        fs::write(rootfs.join("etc/ld.so.conf"), LD_SO_CONF_WITH_CONF_D).expect("ld.so.conf");
    }
    rootfs
}

/// For scripts/nvidia-hook-containers.sh: builds the images into
/// `$NVHOOK_HOOK_CONTAINERS_IMAGES/<name>/rootfs`. Without that variable (a run of every
/// ignored test) it does nothing.
#[test]
#[ignore = "run by scripts/nvidia-hook-containers.sh"]
fn build_images_for_the_fixture_script() {
    let Some(out) = std::env::var_os("NVHOOK_HOOK_CONTAINERS_IMAGES") else {
        eprintln!("NVHOOK_HOOK_CONTAINERS_IMAGES is not set: no images built");
        return;
    };
    for kind in IMAGES {
        build_image(&Path::new(&out).join(kind.name), kind);
    }
}

#[test]
fn nvhook_as_nvidia_cdi_hook_gives_what_nvidias_own_gives() {
    require_root();
    let node = SimNode::create(GPUS);
    assert_eq!(node.driver_version(), FIXTURE_DRIVER);
    let dir = EngineDir::new("nvidia-hook-containers");
    let hook = dir.path().join("nvidia-cdi-hook");
    std::os::unix::fs::symlink(nvhook_bin(), &hook).expect("link nvidia-cdi-hook");
    let spec_text = fs::read_to_string(fixture_dir().join("nvidia-ctk").join(SPEC))
        .expect("NVIDIA's spec")
        .replace("@NODE@", &node.root().display().to_string())
        .replace("@HOOK@", &hook.display().to_string());
    let podman = Podman::new();
    let mut images = Vec::new();
    for kind in IMAGES {
        let rootfs = build_image(&dir.path().join(kind.name), kind);
        let image = format!("localhost/{}:latest", unique_name("nvhook-hook-containers"));
        podman.import(&rootfs, &image);
        images.push((kind.name, image));
    }
    // nvhook's containers in the fixtures' format, for `diff` against them.
    let seen_dir = support::target_tmp_dir().join("nvidia-hook-containers");
    fs::create_dir_all(&seen_dir).expect("create target/tmp/nvidia-hook-containers");
    let known = known_differences();

    let host = host_snapshot();
    let driver = Snapshot::tree(&node.driver_root());
    let mounts_before: BTreeSet<String> = host_mounts_referencing(&[node.root(), podman.dir()])
        .into_iter()
        .collect();
    let mut found = BTreeSet::new();
    let mut order = Vec::new();
    {
        let spec = CdiSpecFile::new("yaml");
        fs::write(spec.path(), &spec_text).expect("install the spec");
        for (name, image) in &images {
            let mut output = podman.run(
                &["--device", DEVICE],
                image,
                &["/usr/bin/busybox", "sh", "-c", LIST],
            );
            output.hook_log = Some(node.log());
            output.assert_success();
            let text = fixture_text(&output.stdout, &node);
            fs::write(seen_dir.join(format!("{name}.txt")), &text).expect("write nvhook's view");
            let ours = Seen::parse(&text, &[]);
            let fixture = fixture_dir()
                .join("nvidia-hook-containers")
                .join(format!("{name}.txt"));
            let theirs = Seen::parse(
                &fs::read_to_string(&fixture)
                    .unwrap_or_else(|e| panic!("read {}: {e}", fixture.display())),
                known.dirs.get(name).map_or(&[][..], Vec::as_slice),
            );
            assert!(
                theirs.parts[&Part::Cache]
                    .iter()
                    .any(|l| l.starts_with("libcuda.so.1 ")),
                "{name}: the fixture has no libcuda.so.1: {theirs:#?}"
            );
            let renamed = known.dirs.get(name).map_or(&[][..], Vec::as_slice);
            assert!(
                renamed.is_empty() || theirs.renamed > 0,
                "{name}: known difference gone: NVIDIA's cache names no library under {:?}",
                renamed.iter().map(|(from, _)| from).collect::<Vec<_>>()
            );
            found.extend(differences(name, &theirs, &ours));
            // The entries both caches have, in the same order.
            let in_both = |a: &Seen, b: &Seen| -> Vec<String> {
                a.cache_order
                    .iter()
                    .filter(|l| b.cache_order.contains(l))
                    .cloned()
                    .collect()
            };
            let (theirs_order, ours_order) = (in_both(&theirs, &ours), in_both(&ours, &theirs));
            if theirs_order != ours_order {
                order.push(format!(
                    "{name}: the cache entries both have, NVIDIA's order: {theirs_order:#?}\nnvhook's: {ours_order:#?}"
                ));
            }
        }
    }

    // The host keeps nothing.
    let mounts_after: BTreeSet<String> = host_mounts_referencing(&[node.root(), podman.dir()])
        .into_iter()
        .collect();
    let left: Vec<&String> = mounts_after.difference(&mounts_before).collect();
    assert!(left.is_empty(), "mounts left on the host: {left:#?}");
    let node_mounts = host_mounts_referencing(&[node.root()]);
    assert!(
        node_mounts.is_empty(),
        "the node is still mounted: {node_mounts:#?}"
    );
    let changed = host.diff(&host_snapshot());
    assert!(changed.is_empty(), "the host changed: {changed:#?}");
    let changed = driver.diff(&Snapshot::tree(&node.driver_root()));
    assert!(
        changed.is_empty(),
        "the node's driver files changed: {changed:#?}"
    );

    // Exactly the known differences.
    assert!(order.is_empty(), "{}", order.join("\n"));
    let unexpected: Vec<_> = found.difference(&known.lines).collect();
    let gone: Vec<_> = known.lines.difference(&found).collect();
    assert!(
        unexpected.is_empty() && gone.is_empty(),
        "nvhook as nvidia-cdi-hook differs from NVIDIA's nvidia-cdi-hook v1.20.0 (nvhook's containers: {})\nunexpected differences: {unexpected:#?}\nknown differences no longer seen: {gone:#?}\nthe known ones: {:#?}",
        seen_dir.display(),
        known.reasons
    );
    eprintln!(
        "nvhook as nvidia-cdi-hook differs from NVIDIA's v1.20.0 in exactly the known ways:\n  {}",
        known.reasons.join("\n  ")
    );
}
