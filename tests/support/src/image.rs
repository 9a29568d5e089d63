//! Container images built from the host's own files, no registry needed.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::cmd::{require_program, run_checked, stdout_of};

/// A rootfs template; each container gets its own copy because the hook
/// writes into the rootfs it is given.
pub struct Image {
    rootfs: PathBuf,
}

impl Image {
    /// An image already assembled at `rootfs`.
    pub(crate) fn at(rootfs: PathBuf) -> Image {
        Image { rootfs }
    }

    pub fn rootfs(&self) -> &Path {
        &self.rootfs
    }

    /// Copies the template to `dest/rootfs` (preserving links, modes and
    /// owners) and returns that path.
    pub fn instantiate(&self, dest: &Path) -> PathBuf {
        let copy = dest.join("rootfs");
        run_checked(Command::new("cp").arg("-a").arg(&self.rootfs).arg(&copy));
        copy
    }
}

#[derive(Clone, Copy, Default)]
pub struct GlibcImageOptions {
    /// Ship the image's own libcuda.so.1 (cuInit returns 999), listed in the
    /// image's loader cache, to prove nvhook's injected driver library wins.
    pub fake_libcuda: bool,
    /// Ship an older driver's libcuda (`libcuda.so.470.256.02`, cuInit 999) with its
    /// SONAME link, on the loader path and in the cache, as images built on one do.
    pub old_driver_libcuda: bool,
    /// RHEL's layout: the loader and libraries in /usr/lib64, no /etc/debian_version.
    pub rhel: bool,
    /// Ship CUDA forward-compatibility libraries of this driver version, as `nvidia/cuda`
    /// images do: see [`CUDA_COMPAT_DIR`].
    pub cuda_compat: Option<&'static str>,
    pub ldcache: LoaderCache,
}

/// The image's /etc/ld.so.cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoaderCache {
    /// What the host's ldconfig writes by default.
    #[default]
    HostDefault,
    /// Only glibc 2.32's new format (`ldconfig -c new`), no old-format part.
    NewFormatOnly,
    /// None at all, and no ldconfig: a distroless image.
    Absent,
}

/// Where [`GlibcImageOptions::cuda_compat`] puts its libraries: `libcuda.so.<version>` and
/// `libnvidia-ptxjitcompiler.so.<version>` (stand-ins with those SONAMEs; cuInit returns 999),
/// their SONAME links, with `/usr/local/cuda` a link to `cuda-12.9`.
pub const CUDA_COMPAT_DIR: &str = "/usr/local/cuda-12.9/compat";

/// Where the old driver's libcuda of [`GlibcImageOptions::old_driver_libcuda`] says it is from.
pub const OLD_DRIVER_VERSION: &str = "470.256.02";

const MULTIARCH: &str = "usr/lib/x86_64-linux-gnu";

/// Builds a Debian-like, usr-merged glibc image under `dir` whose loader,
/// libc and ld.so.cache are genuine, with `/gpucheck` at its root.
pub fn build_glibc_image(dir: &Path, options: GlibcImageOptions) -> Image {
    let rootfs = dir.join("rootfs");
    make_dirs(
        &rootfs,
        &["usr/bin", "usr/sbin", MULTIARCH, "usr/lib64", "etc"],
    );
    make_dirs(&rootfs, &["proc", "dev", "sys", "tmp"]);
    // Relative links, like Debian's: absolute ones would point at the host's
    // /usr while the image is being assembled here.
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        symlink(target, rootfs.join(link)).expect("usr-merge symlink");
    }
    let gpucheck = rootfs.join("gpucheck");
    compile(&[source("gpucheck.c")], &gpucheck, &[]);
    let lib_dir = if options.rhel { "usr/lib64" } else { MULTIARCH };
    for library in shared_dependencies(&gpucheck) {
        match options.rhel {
            true => copy_host_library_into(&rootfs.join(lib_dir), &library),
            false => copy_host_library(&rootfs, &library),
        }
    }
    let fake_libcuda = |name: &str| {
        compile(
            &[source("support/fake_libcuda.c")],
            &rootfs.join(lib_dir).join(name),
            &["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1"],
        );
    };
    if options.fake_libcuda {
        fake_libcuda("libcuda.so.1");
    }
    if options.old_driver_libcuda {
        let versioned = format!("libcuda.so.{OLD_DRIVER_VERSION}");
        fake_libcuda(&versioned);
        symlink(&versioned, rootfs.join(lib_dir).join("libcuda.so.1")).expect("SONAME link");
    }
    if let Some(version) = options.cuda_compat {
        let compat = rootfs.join(CUDA_COMPAT_DIR.trim_start_matches('/'));
        fs::create_dir_all(&compat).expect("create the compat directory");
        for stem in ["libcuda", "libnvidia-ptxjitcompiler"] {
            let file = format!("{stem}.so.{version}");
            compile(
                &[source("support/fake_libcuda.c")],
                &compat.join(&file),
                &["-shared", "-fPIC", &format!("-Wl,-soname,{stem}.so.1")],
            );
            symlink(&file, compat.join(format!("{stem}.so.1"))).expect("SONAME link");
        }
        symlink("cuda-12.9", rootfs.join("usr/local/cuda")).expect("/usr/local/cuda link");
    }
    if !options.rhel {
        // nvhook picks the library directory from this file (Debian family).
        fs::copy("/etc/debian_version", rootfs.join("etc/debian_version"))
            .expect("copy /etc/debian_version");
    }
    fs::write(rootfs.join("etc/ld.so.conf"), format!("/{lib_dir}\n")).expect("write ld.so.conf");
    // The host's ldconfig writes the image's cache, so its format is genuine.
    let mut ldconfig = Command::new(require_program("ldconfig"));
    match options.ldcache {
        LoaderCache::HostDefault => {}
        LoaderCache::NewFormatOnly => {
            ldconfig.args(["-c", "new"]);
        }
        LoaderCache::Absent => return Image { rootfs },
    }
    run_checked(ldconfig.arg("-r").arg(&rootfs));
    Image { rootfs }
}

/// Builds an image holding only a static busybox and its applet links: no
/// loader and no ld.so.cache, like the official busybox image.
pub fn build_busybox_image(dir: &Path) -> Image {
    let rootfs = dir.join("rootfs");
    make_dirs(&rootfs, &["bin", "etc", "usr", "proc", "dev", "sys", "tmp"]);
    let busybox = require_program("busybox");
    assert_static(&busybox);
    fs::copy(&busybox, rootfs.join("bin/busybox")).expect("copy busybox");
    for applet in [
        "sh", "ls", "cat", "test", "stat", "grep", "mount", "readlink",
    ] {
        symlink("busybox", rootfs.join("bin").join(applet)).expect("applet symlink");
    }
    Image { rootfs }
}

pub fn glibc_image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| build_glibc_image(&image_dir("glibc"), GlibcImageOptions::default()))
}

pub fn glibc_image_with_fake_libcuda() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        build_glibc_image(
            &image_dir("glibc-fake-libcuda"),
            GlibcImageOptions {
                fake_libcuda: true,
                ..GlibcImageOptions::default()
            },
        )
    })
}

pub fn busybox_image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| build_busybox_image(&image_dir("busybox")))
}

/// A fresh directory for one image, under this process's build directory.
pub(crate) fn image_dir(name: &str) -> PathBuf {
    let dir = process_build_dir().join(name);
    fs::create_dir_all(&dir).expect("create image dir");
    dir
}

/// `target/tmp/e2e-images-<pid>`: per process, because several test binaries
/// (and several people) may build at once. Directories of processes that are
/// gone are removed first, since statics are never dropped.
fn process_build_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = &super::target_tmp_dir();
        fs::create_dir_all(base).expect("create target/tmp");
        remove_stale_build_dirs(base);
        let dir = base.join(format!("e2e-images-{}", std::process::id()));
        // A leftover from an earlier process that had the same pid.
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).expect("create image build dir");
        dir
    })
}

fn remove_stale_build_dirs(base: &Path) {
    for entry in fs::read_dir(base).expect("read target/tmp").flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("e2e-images-")) else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// A file under tests/.
pub fn source(relative: &str) -> PathBuf {
    // This crate is tests/support.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/support has a parent")
        .join(relative)
}

fn make_dirs(root: &Path, dirs: &[&str]) {
    for dir in dirs {
        fs::create_dir_all(root.join(dir)).expect("create image directory");
    }
}

/// The host's cc, warnings as errors.
pub fn compile(sources: &[PathBuf], output: &Path, flags: &[&str]) {
    run_checked(
        Command::new(require_program("cc"))
            .args(["-O1", "-Wall", "-Wextra", "-Werror"])
            .args(flags)
            .arg("-o")
            .arg(output)
            .args(sources),
    );
}

/// Host paths of the loader and libraries `binary` needs, as ldd names them.
fn shared_dependencies(binary: &Path) -> Vec<PathBuf> {
    let listing = stdout_of(Command::new(require_program("ldd")).arg(binary));
    listing.lines().filter_map(ldd_path).collect()
}

/// The absolute path on one ldd line: `libc.so.6 => /lib/... (0x..)` or the
/// loader's `/lib64/ld-linux-x86-64.so.2 (0x..)`; the vDSO has none.
fn ldd_path(line: &str) -> Option<PathBuf> {
    let line = line.trim();
    let after_arrow = line.split_once("=> ").map_or(line, |(_, rest)| rest);
    let path = after_arrow.split_whitespace().next()?;
    path.starts_with('/').then(|| PathBuf::from(path))
}

/// Copies the real file behind `host_path` to the same place in `rootfs`, and
/// recreates the link when the name the binary asks for is a symlink (the
/// loader's /lib64 name is an absolute link on Debian).
fn copy_host_library(rootfs: &Path, host_path: &Path) {
    let real = fs::canonicalize(host_path).expect("canonicalize host library");
    let real_in_root = in_root(rootfs, &real);
    fs::copy(&real, &real_in_root)
        .unwrap_or_else(|err| panic!("copy {} into image: {err}", real.display()));
    let wanted = in_root(rootfs, host_path);
    if !wanted.exists() {
        let target = fs::read_link(host_path).unwrap_or_else(|err| {
            panic!(
                "{} is not reachable in the image and is not a symlink: {err}",
                host_path.display()
            )
        });
        symlink(target, &wanted).expect("recreate library symlink");
    }
}

/// Copies the real file behind `host_path` into `dir` under its own name (the name the
/// binary asks for): a library directory laid out unlike the host's.
fn copy_host_library_into(dir: &Path, host_path: &Path) {
    let real = fs::canonicalize(host_path).expect("canonicalize host library");
    let name = host_path.file_name().expect("library file name");
    fs::copy(&real, dir.join(name))
        .unwrap_or_else(|err| panic!("copy {} into image: {err}", real.display()));
}

/// An Alpine-like image: musl's loader (`/lib/ld-musl-x86_64.so.1`, which is its libc too),
/// `/gpucheck` built with musl-gcc, `/etc/alpine-release`, no glibc and no ld.so.cache.
pub fn build_musl_image(dir: &Path) -> Image {
    let rootfs = dir.join("rootfs");
    make_dirs(
        &rootfs,
        &[
            "lib", "usr/lib", "usr/bin", "etc", "proc", "dev", "sys", "tmp",
        ],
    );
    let gpucheck = rootfs.join("gpucheck");
    run_checked(
        Command::new(require_program("musl-gcc"))
            .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&gpucheck)
            .arg(source("gpucheck.c")),
    );
    let loader = "/lib/ld-musl-x86_64.so.1";
    let real = fs::canonicalize(loader)
        .unwrap_or_else(|e| panic!("{loader}: {e} (install Debian's musl-tools)"));
    fs::copy(real, in_root(&rootfs, Path::new(loader))).expect("copy musl's loader");
    fs::write(rootfs.join("etc/alpine-release"), "3.20.0\n").expect("write alpine-release");
    Image { rootfs }
}

fn in_root(rootfs: &Path, absolute: &Path) -> PathBuf {
    rootfs.join(absolute.strip_prefix("/").expect("absolute path"))
}

fn assert_static(binary: &Path) {
    let output = Command::new(require_program("ldd"))
        .arg(binary)
        .output()
        .expect("run ldd");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        !output.status.success() || text.contains("statically linked"),
        "{} is dynamically linked; install Debian's busybox-static",
        binary.display()
    );
}
