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
}

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
    for library in shared_dependencies(&gpucheck) {
        copy_host_library(&rootfs, &library);
    }
    if options.fake_libcuda {
        let fake = rootfs.join(MULTIARCH).join("libcuda.so.1");
        compile(
            &[source("support/fake_libcuda.c")],
            &fake,
            &["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1"],
        );
    }
    // nvhook picks the library directory from this file (Debian family).
    fs::copy("/etc/debian_version", rootfs.join("etc/debian_version"))
        .expect("copy /etc/debian_version");
    fs::write(rootfs.join("etc/ld.so.conf"), format!("/{MULTIARCH}\n")).expect("write ld.so.conf");
    // The host's ldconfig writes the image's cache, so its format is genuine.
    run_checked(
        Command::new(require_program("ldconfig"))
            .arg("-r")
            .arg(&rootfs),
    );
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
            GlibcImageOptions { fake_libcuda: true },
        )
    })
}

pub fn busybox_image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| build_busybox_image(&image_dir("busybox")))
}

/// A fresh directory for one image, under this process's build directory.
fn image_dir(name: &str) -> PathBuf {
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
