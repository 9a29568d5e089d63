//! Hostile images: crafted rootfs images, each started with a GPU request through real runc
//! and nvhook on a simulated node. Whatever a case plants, nothing outside its rootfs may
//! change: not the canary tree beside the rootfs (reachable from inside by `..` or by its
//! absolute host path), not the host's own copies of the hook's targets (/etc/ld.so.cache,
//! /usr/bin, /lib/firmware, ...), not the mount table of the namespace runc ran in. The
//! hook never crashes. Whether the container then starts with its GPU or is refused with one
//! `nvhook:` line is the hook's choice, documented per case in SECURITY.md and asserted here.
//!
//! Run as root after `cargo build --workspace`: `cargo test --test hostile_images`.

use nvhook_test_support as support;

use std::cell::RefCell;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use support::{
    Bundle, MountNs, OpenWatch, Output, RuntimeEnv, SimNode, Snapshot, busybox_image, compile,
    glibc_image, host_mounts_referencing, host_snapshot, require_program, require_root, run_in_ns,
    source, table_diff,
};

const LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";
/// The hook's refusal to write on a bind mount the image's links lead to.
const INTO_VOLUME: &str = "nvhook will not write into a volume";
/// The refusal to write through an image link into a mount inside a volume that the spec
/// does not list (a host mount within the host directory, carried in by `rbind`).
const INTO_MOUNT_IN_VOLUME: &str = "the image's /usr/lib/x86_64-linux-gnu is a link to /data/lib, on a mount that is not the container's own filesystem: nvhook will not write into a volume";
/// The refusal to make device nodes in a host directory bound over the runtime's /dev tmpfs.
const INTO_DEV_VOLUME: &str =
    "/dev is the volume mounted at /dev: nvhook will not write into a volume";
/// How a volume is bound: writable, read-only, and writable with shared propagation.
const VOLUME_KINDS: [&[&str]; 3] = [&["rw"], &["ro"], &["rw", "rshared"]];
/// The hook's refusal to create a directory through a link that leads nowhere in the image.
const LIBDIR_CREATE: &str = "create directory /usr/lib/x86_64-linux-gnu";
/// More `..` than any rootfs path is deep: resolved on the host, this reaches `/`.
const UP_TO_HOST_ROOT: usize = 24;

// ------------------------------------------------------------------ what a case is

#[derive(Clone, Copy, Debug)]
enum Base {
    /// The glibc image: its loader, libc and ld.so.cache are genuine; runs /gpucheck.
    Glibc,
    /// The static busybox image, marked Debian (so the library directory is LIBDIR), with
    /// nothing in LIBDIR: for cases that break the library directory the loader needs.
    Busybox,
}

#[derive(Debug)]
enum Expect {
    /// The container starts and reaches its GPU (and, on glibc, loads libcuda).
    Starts,
    /// A glibc container starts, and libcuda.so.1 is this file (its real path).
    StartsLoading(&'static str),
    /// The hook refuses: one `nvhook:` line containing this text; the container never runs.
    Refused(&'static str),
    /// runc itself refuses the image before any hook runs; its message contains this text.
    RuncRefuses(&'static str),
    /// Racing: either starts with its GPU or is refused by the hook, never anything else.
    StartsOrRefused,
}

struct Case {
    name: &'static str,
    base: Base,
    plant: fn(&Plant),
    expect: Expect,
}

fn case(name: &'static str, base: Base, plant: fn(&Plant), expect: Expect) -> Case {
    Case {
        name,
        base,
        plant,
        expect,
    }
}

use Base::{Busybox, Glibc};
use Expect::{Refused, RuncRefuses, Starts, StartsLoading, StartsOrRefused};

// ------------------------------------------------------------------ planting

/// Plants hostile entries in a fresh rootfs. Paths are container paths (`/usr/bin`).
struct Plant<'a> {
    rootfs: &'a Path,
    /// A tree on the host beside the rootfs, mirroring the hook's targets.
    canary: &'a Path,
    version: &'a str,
    /// Entries the hook must never open (device nodes, FIFOs).
    never_opened: RefCell<Vec<PathBuf>>,
    /// Additions to the container process's environment.
    env: RefCell<Vec<String>>,
    /// The environment nvhook-runtime is invoked with; none: plain runc runs the hook.
    shim_env: RefCell<Option<Vec<(&'static str, String)>>>,
    /// Pairs of entries exchanged over and over while the container starts.
    swaps: RefCell<Vec<(PathBuf, PathBuf)>>,
    /// Host directories bound into the container: (destination, source, mount options).
    volumes: RefCell<Vec<(String, PathBuf, &'static [&'static str])>>,
    /// Host bind mounts inside a volume's source, made in the namespace runc runs in (the
    /// host as runc sees it) and ended with it: (mount point, the host directory mounted).
    nested: RefCell<Vec<(PathBuf, PathBuf)>>,
    /// The node's libcuda, a real library to ship as a volume's compat driver.
    host_libcuda: PathBuf,
    /// The node's nvhook config, for variants of it.
    node_config: PathBuf,
}

impl Plant<'_> {
    fn path(&self, at: &str) -> PathBuf {
        self.rootfs.join(at.trim_start_matches('/'))
    }

    /// Removes whatever is at `at` and makes its parent directory.
    fn clear(&self, at: &str) -> PathBuf {
        let p = self.path(at);
        match fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(&p).expect("remove dir"),
            Ok(_) => fs::remove_file(&p).expect("remove file"),
            Err(_) => {}
        }
        fs::create_dir_all(p.parent().expect("parent")).expect("create parent");
        p
    }

    fn link(&self, at: &str, target: &str) {
        symlink(target, self.clear(at)).expect("plant symlink");
    }

    /// The canary's copy of `sub`, as an absolute host path.
    fn canary_abs(&self, sub: &str) -> String {
        self.canary
            .join(sub.trim_start_matches('/'))
            .display()
            .to_string()
    }

    /// The canary's copy of `sub`, relative to the directory holding `at`: resolved on the
    /// host, it climbs out of the rootfs into the canary beside it.
    fn canary_rel(&self, at: &str, sub: &str) -> String {
        let depth = at.trim_matches('/').split('/').count();
        format!(
            "{}canary/{}",
            "../".repeat(depth),
            sub.trim_start_matches('/')
        )
    }

    /// The host's own `path`, relative: `../../../…/etc/ld.so.cache`.
    fn host_rel(&self, path: &str) -> String {
        format!(
            "{}{}",
            "../".repeat(UP_TO_HOST_ROOT),
            path.trim_start_matches('/')
        )
    }

    fn file(&self, at: &str, bytes: &[u8]) {
        fs::write(self.clear(at), bytes).expect("plant file");
    }

    fn dir(&self, at: &str) {
        fs::create_dir_all(self.clear(at)).expect("plant dir");
    }

    fn fifo(&self, at: &str) {
        let p = self.clear(at);
        let c = CString::new(p.as_os_str().as_bytes()).expect("path");
        // SAFETY: c is NUL-terminated.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
        self.never_opened.borrow_mut().push(p);
    }

    /// A char device node with the numbers of /dev/null (harmless if it were opened; the
    /// test sees any open).
    fn node(&self, at: &str) {
        let p = self.clear(at);
        let c = CString::new(p.as_os_str().as_bytes()).expect("path");
        // SAFETY: c is NUL-terminated.
        let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(1, 3)) };
        assert_eq!(rc, 0, "mknod");
        self.never_opened.borrow_mut().push(p);
    }

    fn hardlink(&self, at: &str, existing: &Path) {
        fs::hard_link(existing, self.clear(at)).expect("plant hard link");
    }

    fn lib(&self, name: &str) -> String {
        format!("{LIBDIR}/{name}")
    }

    fn versioned(&self, stem: &str) -> String {
        format!("{stem}.{}", self.version)
    }

    fn firmware(&self) -> String {
        format!("/lib/firmware/nvidia/{}/gsp_ga10x.bin", self.version)
    }

    fn env(&self, var: String) {
        self.env.borrow_mut().push(var);
    }

    /// A host directory (root's, 0755, as hostPath volumes are) bound at `at` with `options`,
    /// holding what a host directory would that nvhook must not touch: a loader cache, a
    /// `lib/libcuda.so.1` that is nobody's link, and a newer driver's `compat/` libcuda.
    fn volume(&self, at: &str, options: &'static [&'static str]) {
        self.volume_source(at, options);
    }

    /// `volume`, returning the host directory bound.
    fn volume_source(&self, at: &str, options: &'static [&'static str]) -> PathBuf {
        let n = self.volumes.borrow().len();
        let source = self
            .canary
            .parent()
            .expect("bundle dir")
            .join(format!("volume-{n}"));
        for dir in ["lib", "compat"] {
            fs::create_dir_all(source.join(dir)).expect("volume dir");
        }
        fs::write(source.join("ld.so.cache"), b"the host's own cache").expect("volume file");
        fs::write(source.join("lib/libcuda.so.1"), b"the host's own file").expect("volume file");
        fs::copy(&self.host_libcuda, source.join("compat/libcuda.so.999.0.0"))
            .expect("volume compat library");
        self.volumes
            .borrow_mut()
            .push((at.to_string(), source.clone(), options));
        source
    }

    /// A volume at `at` whose host directory has a bind mount of its own at `sub` (a host
    /// directory mounted inside the hostPath, not listed in the spec): runc's rbind carries
    /// it into the container. The host directory mounted there must stay empty.
    fn volume_with_mount_inside(&self, at: &str, options: &'static [&'static str], sub: &str) {
        let source = self.volume_source(at, options);
        let mount_point = source.join(sub);
        fs::create_dir_all(&mount_point).expect("nested mount point");
        let inner = source.with_file_name(format!(
            "{}-inner",
            source.file_name().expect("volume name").to_string_lossy()
        ));
        fs::create_dir(&inner).expect("nested mount source");
        self.nested.borrow_mut().push((mount_point, inner));
    }

    /// nvhook-runtime in `runtime-mode = "cdi"`: runc makes the mounts, and nvhook's
    /// createRuntime hook the links and the loader cache.
    fn via_nvhook_runtime_cdi_mode(&self) {
        let base = fs::read_to_string(&self.node_config).expect("read node config");
        let config = self
            .canary
            .parent()
            .expect("bundle dir")
            .join("cdi-mode.toml");
        fs::write(&config, format!("{base}runtime-mode = \"cdi\"\n")).expect("write config");
        self.via_nvhook_runtime(vec![("NVHOOK_CONFIG", config.display().to_string())]);
    }

    fn via_nvhook_runtime(&self, vars: Vec<(&'static str, String)>) {
        *self.shim_env.borrow_mut() = Some(vars);
    }

    /// While the container starts, `at` and a link planted beside it named `decoy` trade
    /// places (renameat2 RENAME_EXCHANGE) again and again.
    fn swap_during_run(&self, at: &str, decoy: &str, link_target: &str) {
        self.link(decoy, link_target);
        self.swaps
            .borrow_mut()
            .push((self.path(at), self.path(decoy)));
    }
}

/// The canary: the hook's targets as they would be on a host, each holding a file.
fn fill_canary(canary: &Path, version: &str) {
    for (path, content) in [
        (format!("{LIBDIR}/libcuda.so.1"), "canary soname"),
        (format!("{LIBDIR}/libcuda.so.{version}"), "canary library"),
        ("/usr/bin/nvidia-smi".into(), "canary binary"),
        ("/etc/ld.so.cache".into(), "canary cache"),
        ("/etc/ld.so.conf.d/keep.conf".into(), "/canary\n"),
        (
            format!("/lib/firmware/nvidia/{version}/gsp_ga10x.bin"),
            "canary firmware",
        ),
        ("/run/nvidia-persistenced/socket".into(), "canary socket"),
        ("/proc/driver/nvidia/params".into(), "canary params"),
        ("/dev/keep".into(), "canary dev"),
        ("/file".into(), "canary file"),
    ] {
        let p = canary.join(path.trim_start_matches('/'));
        fs::create_dir_all(p.parent().expect("parent")).expect("canary dir");
        fs::write(p, content).expect("canary file");
    }
}

// ------------------------------------------------------------------ the cases

#[rustfmt::skip]
fn library_directory() -> Vec<Case> {
    vec![
        case("libdir -> canary (absolute)", Busybox, |p| p.link(LIBDIR, &p.canary_abs(LIBDIR)), Refused(LIBDIR_CREATE)),
        case("libdir -> canary (relative)", Busybox, |p| p.link(LIBDIR, &p.canary_rel(LIBDIR, LIBDIR)), Refused(LIBDIR_CREATE)),
        case("libdir -> host libdir (relative)", Busybox, |p| p.link(LIBDIR, &p.host_rel(LIBDIR)), Refused(LIBDIR)),
        case("libdir -> /proc/self/root/…", Busybox, |p| p.link(LIBDIR, "/proc/self/root/usr/lib/x86_64-linux-gnu"), Refused(LIBDIR)),
        case("/usr/lib -> canary (relative)", Busybox, |p| p.link("/usr/lib", &p.canary_rel("/usr/lib", "/usr/lib")), Refused(LIBDIR_CREATE)),
        case("/usr -> canary (absolute)", Busybox, |p| p.link("/usr", &p.canary_abs("/usr")), Refused(LIBDIR_CREATE)),
        case(
            "libcuda.so.1 -> canary (absolute)",
            Glibc,
            |p| {
                p.link(
                    &p.lib("libcuda.so.1"),
                    &p.canary_abs(&p.lib("libcuda.so.1")),
                )
            },
            Starts,
        ),
        case(
            "libcuda.so.<ver> -> canary (relative)",
            Glibc,
            |p| {
                let at = p.lib(&p.versioned("libcuda.so"));
                p.link(&at, &p.canary_rel(&at, &at));
            },
            Starts,
        ),
        case("libcuda.so -> host /usr/bin/true", Glibc, |p| p.link(&p.lib("libcuda.so"), &p.host_rel("/usr/bin/true")), Starts),
    ]
}

#[rustfmt::skip]
fn usr_bin() -> Vec<Case> {
    vec![
        case("/usr/bin -> canary (absolute)", Glibc, |p| p.link("/usr/bin", &p.canary_abs("/usr/bin")), Refused("create directory /usr/bin")),
        case("/usr/bin -> canary (relative)", Glibc, |p| p.link("/usr/bin", &p.canary_rel("/usr/bin", "/usr/bin")), Refused("create directory /usr/bin")),
        case("/usr/bin -> host /usr/bin (relative)", Glibc, |p| p.link("/usr/bin", &p.host_rel("/usr/bin")), Refused("/usr/bin")),
        case("/usr/bin -> /proc/1/root/usr/bin", Glibc, |p| p.link("/usr/bin", "/proc/1/root/usr/bin"), Refused("/usr/bin")),
        case("nvidia-smi -> canary (absolute)", Glibc, |p| p.link("/usr/bin/nvidia-smi", &p.canary_abs("/usr/bin/nvidia-smi")), Starts),
        case("nvidia-smi -> host /usr/bin/true", Glibc, |p| p.link("/usr/bin/nvidia-smi", &p.host_rel("/usr/bin/true")), Starts),
    ]
}

#[rustfmt::skip]
fn etc() -> Vec<Case> {
    vec![
        case("/etc -> canary (absolute)", Glibc, |p| p.link("/etc", &p.canary_abs("/etc")), Refused("create directory /etc/")),
        case("/etc -> canary (relative)", Glibc, |p| p.link("/etc", &p.canary_rel("/etc", "/etc")), Refused("create directory /etc/")),
        case("/etc -> host /etc (relative)", Glibc, |p| p.link("/etc", &p.host_rel("/etc")), Refused("/etc")),
        case("/etc/debian_version -> host file", Glibc, |p| p.link("/etc/debian_version", &p.host_rel("/etc/debian_version")), Starts),
    ]
}

#[rustfmt::skip]
fn ld_so_cache() -> Vec<Case> {
    vec![
        case("ld.so.cache -> canary (absolute)", Glibc, |p| p.link("/etc/ld.so.cache", &p.canary_abs("/etc/ld.so.cache")), Starts),
        case(
            "ld.so.cache -> canary (relative)",
            Glibc,
            |p| {
                p.link(
                    "/etc/ld.so.cache",
                    &p.canary_rel("/etc/ld.so.cache", "/etc/ld.so.cache"),
                )
            },
            Starts,
        ),
        case("ld.so.cache -> host cache (relative)", Glibc, |p| p.link("/etc/ld.so.cache", &p.host_rel("/etc/ld.so.cache")), Starts),
        case("ld.so.cache -> /proc/self/root/etc/ld.so.cache", Glibc, |p| p.link("/etc/ld.so.cache", "/proc/self/root/etc/ld.so.cache"), Starts),
    ]
}

#[rustfmt::skip]
fn ld_so_conf_d() -> Vec<Case> {
    const CONF: &str = "/etc/ld.so.conf.d/000-nvhook.conf";
    vec![
        case("ld.so.conf.d -> canary (absolute)", Glibc, |p| p.link("/etc/ld.so.conf.d", &p.canary_abs("/etc/ld.so.conf.d")), Refused("create directory /etc/ld.so.conf.d")),
        case(
            "ld.so.conf.d -> canary (relative)",
            Glibc,
            |p| {
                p.link(
                    "/etc/ld.so.conf.d",
                    &p.canary_rel("/etc/ld.so.conf.d", "/etc/ld.so.conf.d"),
                )
            },
            Refused("create directory /etc/ld.so.conf.d"),
        ),
        case("ld.so.conf.d -> host dir (relative)", Glibc, |p| p.link("/etc/ld.so.conf.d", &p.host_rel("/etc/ld.so.conf.d")), Refused("/etc/ld.so.conf.d")),
        case("000-nvhook.conf -> canary file", Glibc, |p| p.link(CONF, &p.canary_abs("/file")), Starts),
        case("000-nvhook.conf -> host ld.so.conf", Glibc, |p| p.link(CONF, &p.host_rel("/etc/ld.so.conf")), Starts),
    ]
}

#[rustfmt::skip]
fn firmware() -> Vec<Case> {
    // The glibc image is usr-merged: /lib is a link to usr/lib.
    vec![
        case("/lib/firmware -> canary (absolute)", Glibc, |p| p.link("/usr/lib/firmware", &p.canary_abs("/lib/firmware")), Refused("create directory /lib/firmware/nvidia/")),
        case(
            "/lib/firmware -> canary (relative)",
            Glibc,
            |p| {
                p.link(
                    "/usr/lib/firmware",
                    &p.canary_rel("/usr/lib/firmware", "/lib/firmware"),
                )
            },
            Refused("create directory /lib/firmware/nvidia/"),
        ),
        case(
            "/lib/firmware/nvidia -> host (relative)",
            Glibc,
            |p| {
                p.link(
                    "/usr/lib/firmware/nvidia",
                    &p.host_rel("/lib/firmware/nvidia"),
                )
            },
            Refused("/lib/firmware"),
        ),
        case(
            "gsp firmware file -> canary",
            Glibc,
            |p| {
                let at = format!("/usr{}", p.firmware());
                p.link(&at, &p.canary_abs(&p.firmware()));
            },
            Starts,
        ),
        case("/lib -> canary (absolute)", Busybox, |p| p.link("/lib", &p.canary_abs("/lib")), Refused("create directory /lib/firmware/nvidia/")),
    ]
}

#[rustfmt::skip]
fn proc_driver() -> Vec<Case> {
    vec![
        case("/proc/driver -> canary (absolute)", Glibc, |p| p.link("/proc/driver", &p.canary_abs("/proc/driver")), Starts),
        case(
            "/proc/driver/nvidia -> canary (relative)",
            Glibc,
            |p| {
                p.link(
                    "/proc/driver/nvidia",
                    &p.canary_rel("/proc/driver/nvidia", "/proc/driver/nvidia"),
                )
            },
            Starts,
        ),
        case("/proc -> canary (absolute)", Glibc, |p| p.link("/proc", &p.canary_abs("/proc")), RuncRefuses("proc")),
        case("/proc is a file", Glibc, |p| p.file("/proc", b"not a directory"), RuncRefuses("proc")),
    ]
}

#[rustfmt::skip]
fn run_sockets() -> Vec<Case> {
    const SOCKET: &str = "/run/nvidia-persistenced/socket";
    vec![
        case("/run -> canary (absolute)", Glibc, |p| p.link("/run", &p.canary_abs("/run")), Refused("create directory /run/nvidia-persistenced")),
        case("/run -> canary (relative)", Glibc, |p| p.link("/run", &p.canary_rel("/run", "/run")), Refused("create directory /run/nvidia-persistenced")),
        case(
            "/var/run -> ../run -> canary",
            Glibc,
            |p| {
                p.link("/var/run", "../run");
                p.link("/run", &p.canary_abs("/run"));
            },
            Refused("create directory /run/nvidia-persistenced"),
        ),
        case(
            "/run/nvidia-persistenced -> host (relative)",
            Glibc,
            |p| {
                p.link(
                    "/run/nvidia-persistenced",
                    &p.host_rel("/run/nvidia-persistenced"),
                )
            },
            Refused("/run/nvidia-persistenced"),
        ),
        case("socket -> canary (absolute)", Glibc, |p| p.link(SOCKET, &p.canary_abs(SOCKET)), Starts),
    ]
}

#[rustfmt::skip]
fn loops_and_chains() -> Vec<Case> {
    vec![
        case("libdir -> itself", Busybox, |p| p.link(LIBDIR, "x86_64-linux-gnu"), Refused(LIBDIR)),
        case(
            "/usr/bin <-> /usr/bin2 loop",
            Glibc,
            |p| {
                p.link("/usr/bin", "bin2");
                p.link("/usr/bin2", "bin");
            },
            Refused("/usr/bin"),
        ),
        case("ld.so.cache -> itself", Glibc, |p| p.link("/etc/ld.so.cache", "/etc/ld.so.cache"), Starts),
        case("libdir: chain of 41 links", Busybox, |p| chain(p, 41, "/usr/lib/real"), Refused(LIBDIR)),
        case(
            "libdir: chain of 30 links -> canary",
            Busybox,
            |p| {
                let end = p.canary_abs(LIBDIR);
                chain(p, 30, &end);
            },
            Refused(LIBDIR_CREATE),
        ),
        case(
            "libdir -> 3900-byte relative escape",
            Busybox,
            |p| {
                let target = format!("{}canary{LIBDIR}", "../".repeat(1300));
                p.link(LIBDIR, &target);
            },
            Refused(LIBDIR_CREATE),
        ),
    ]
}

/// LIBDIR -> /chain/1 -> /chain/2 … -> /chain/n -> `end`.
fn chain(p: &Plant, n: usize, end: &str) {
    fs::create_dir_all(p.path("/usr/lib/real")).expect("mkdir");
    p.link(LIBDIR, "/chain/1");
    for i in 1..n {
        p.link(&format!("/chain/{i}"), &format!("/chain/{}", i + 1));
    }
    p.link(&format!("/chain/{n}"), end);
}

#[rustfmt::skip]
fn file_or_directory() -> Vec<Case> {
    vec![
        case("/usr/bin is a file", Glibc, |p| p.file("/usr/bin", b"x"), Refused("/usr/bin")),
        case("libdir is a file", Busybox, |p| p.file(LIBDIR, b"x"), Refused(LIBDIR)),
        case("nvidia-smi is a directory", Glibc, |p| p.dir("/usr/bin/nvidia-smi"), Refused("directory where a file is expected")),
        case("libcuda.so.1 is a directory", Glibc, |p| p.dir(&p.lib("libcuda.so.1")), Refused("the image has a directory there")),
        case("ld.so.cache is a directory", Glibc, |p| p.dir("/etc/ld.so.cache"), Refused("/etc/ld.so.cache")),
        case("ld.so.conf.d is a file", Glibc, |p| p.file("/etc/ld.so.conf.d", b"x"), Refused("/etc/ld.so.conf.d")),
        case("socket is a directory", Glibc, |p| p.dir("/run/nvidia-persistenced/socket"), Refused("directory where a file is expected")),
        case("/lib/firmware is a file", Glibc, |p| p.file("/usr/lib/firmware", b"x"), Refused("/lib/firmware")),
    ]
}

#[rustfmt::skip]
fn special_files() -> Vec<Case> {
    vec![
        case("nvidia-smi is a FIFO", Glibc, |p| p.fifo("/usr/bin/nvidia-smi"), Refused("changed type")),
        case("libcuda.so.<ver> is a device node", Glibc, |p| p.node(&p.lib(&p.versioned("libcuda.so"))), Refused("changed type")),
        case("ld.so.cache is a FIFO", Busybox, |p| p.fifo("/etc/ld.so.cache"), Starts),
        case("ld.so.cache is a device node", Busybox, |p| p.node("/etc/ld.so.cache"), Starts),
        case("libcuda.so is a FIFO", Glibc, |p| p.fifo(&p.lib("libcuda.so")), Starts),
        case("socket is a device node", Glibc, |p| p.node("/run/nvidia-persistenced/socket"), Refused("changed type")),
    ]
}

#[rustfmt::skip]
fn hard_links() -> Vec<Case> {
    vec![
        case("ld.so.cache = host /etc/ld.so.cache", Glibc, |p| p.hardlink("/etc/ld.so.cache", Path::new("/etc/ld.so.cache")), Starts),
        case(
            "ld.so.cache = canary cache",
            Glibc,
            |p| {
                p.hardlink(
                    "/etc/ld.so.cache",
                    Path::new(&p.canary_abs("/etc/ld.so.cache")),
                )
            },
            Starts,
        ),
        case(
            "libcuda.so.<ver> = canary library",
            Glibc,
            |p| {
                let at = p.lib(&p.versioned("libcuda.so"));
                p.hardlink(&at, Path::new(&p.canary_abs(&at)));
            },
            Starts,
        ),
        case("nvidia-smi = host /usr/bin/true", Glibc, |p| p.hardlink("/usr/bin/nvidia-smi", Path::new("/usr/bin/true")), Starts),
        case(
            "000-nvhook.conf = canary file",
            Glibc,
            |p| {
                p.hardlink(
                    "/etc/ld.so.conf.d/000-nvhook.conf",
                    Path::new(&p.canary_abs("/file")),
                )
            },
            Starts,
        ),
    ]
}

#[rustfmt::skip]
fn garbage_ld_so_cache() -> Vec<Case> {
    vec![
        case("random bytes", Glibc, |p| p.file("/etc/ld.so.cache", &pseudo_random(4096)), Starts),
        case("empty", Glibc, |p| p.file("/etc/ld.so.cache", b""), Starts),
        case(
            "genuine, truncated to half",
            Glibc,
            |p| {
                let cache = fs::read(p.path("/etc/ld.so.cache")).expect("image cache");
                p.file("/etc/ld.so.cache", &cache[..cache.len() / 2]);
            },
            Starts,
        ),
        case(
            "genuine, entry count 0xffffffff",
            Glibc,
            |p| {
                let mut cache = fs::read(p.path("/etc/ld.so.cache")).expect("image cache");
                // The new format: 20-byte magic and version, then the u32 entry count.
                cache[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
                p.file("/etc/ld.so.cache", &cache);
            },
            Starts,
        ),
        case(
            "genuine, string offsets out of bounds",
            Glibc,
            |p| {
                let mut cache = fs::read(p.path("/etc/ld.so.cache")).expect("image cache");
                // Header (48 bytes), then 24-byte entries: flags, key, value, osversion, hwcap.
                for entry in cache[48..].chunks_exact_mut(24).take(8) {
                    entry[4..12].copy_from_slice(&[0xff; 8]);
                }
                p.file("/etc/ld.so.cache", &cache);
            },
            Starts,
        ),
        case("magic only", Glibc, |p| p.file("/etc/ld.so.cache", b"glibc-ld.so.cache1.1"), Starts),
        case(
            "17 MiB (sparse)",
            Glibc,
            |p| {
                let f = fs::File::create(p.clear("/etc/ld.so.cache")).expect("create");
                f.set_len(17 << 20).expect("set_len");
            },
            Refused("larger than"),
        ),
    ]
}

#[rustfmt::skip]
fn loader_environment() -> Vec<Case> {
    vec![
        case(
            "image env LD_PRELOAD, LD_LIBRARY_PATH (runc + hook)",
            Glibc,
            |p| {
                let evil = EvilLibs::build(p);
                p.env(format!("LD_PRELOAD={}", evil.preload));
                p.env(format!("LD_LIBRARY_PATH={}", evil.dir));
            },
            Starts,
        ),
        case(
            "image env LD_PRELOAD=/proc/self/cwd/… (CVE-2025-23266)",
            Glibc,
            |p| {
                let evil = EvilLibs::build(p);
                fs::copy(&evil.preload, p.path("/preload.so")).expect("copy into image");
                p.env("LD_PRELOAD=/proc/self/cwd/preload.so".into());
            },
            Starts,
        ),
        case(
            "image env LD_PRELOAD, LD_LIBRARY_PATH (nvhook-runtime)",
            Glibc,
            |p| {
                let evil = EvilLibs::build(p);
                p.env(format!("LD_PRELOAD={}", evil.preload));
                p.env(format!("LD_LIBRARY_PATH={}", evil.dir));
                p.via_nvhook_runtime(Vec::new());
            },
            Starts,
        ),
        case(
            "nvhook-runtime invoked with LD_PRELOAD, LD_LIBRARY_PATH",
            Glibc,
            |p| {
                let evil = EvilLibs::build(p);
                p.via_nvhook_runtime(vec![
                    ("LD_PRELOAD", evil.preload),
                    ("LD_LIBRARY_PATH", evil.dir),
                ]);
            },
            Starts,
        ),
    ]
}

/// Host libraries whose constructors write `<bundle>/evil/marker`, out of the container's
/// sight: `preload.so`, and a `libnvidia-ml.so.1` for LD_LIBRARY_PATH to offer.
struct EvilLibs {
    preload: String,
    dir: String,
}

impl EvilLibs {
    fn build(p: &Plant) -> EvilLibs {
        let dir = evil_dir(p.canary.parent().expect("bundle dir"));
        fs::create_dir_all(&dir).expect("mkdir evil");
        let marker = format!("-DMARKER=\"{}\"", dir.join("marker").display());
        for (file, tag, soname) in [
            ("preload.so", "preload", "preload.so"),
            ("libnvidia-ml.so.1", "nvml", "libnvidia-ml.so.1"),
        ] {
            compile(
                &[source("support/marker_lib.c")],
                &dir.join(file),
                &[
                    "-shared",
                    "-fPIC",
                    &format!("-Wl,-soname,{soname}"),
                    &marker,
                    &format!("-DTAG=\"{tag}\""),
                ],
            );
        }
        EvilLibs {
            preload: dir.join("preload.so").display().to_string(),
            dir: dir.display().to_string(),
        }
    }
}

fn evil_dir(bundle: &Path) -> PathBuf {
    bundle.join("evil")
}

/// Which host processes loaded the evil libraries: never nvhook (static: it loads none) nor
/// its NVML helper, never anything through LD_LIBRARY_PATH's libnvidia-ml; nothing at all
/// unless nvhook-runtime itself was given LD_PRELOAD (the engine's own environment: then
/// `runtime`, which nvhook-runtime execs with that environment, must show it, proving the probe
/// works).
fn check_marker(bundle: &Path, preloaded_runtime: Option<&Path>, broken: &mut Vec<String>) {
    let marker = fs::read_to_string(evil_dir(bundle).join("marker")).unwrap_or_default();
    let ours = [support::nvhook_bin(), support::engines::nvhook_nvml_bin()]
        .map(|p| p.display().to_string());
    for line in marker.lines() {
        let (tag, exe) = line.split_once(' ').unwrap_or((line, ""));
        if ours.iter().any(|o| o == exe) {
            broken.push(format!("nvhook loaded an evil library: {line}"));
        } else if tag == "nvml" {
            broken.push(format!(
                "libnvidia-ml was found through LD_LIBRARY_PATH: {line}"
            ));
        } else if preloaded_runtime.is_none() {
            broken.push(format!(
                "a host process loaded the image's LD_PRELOAD: {line}"
            ));
        }
    }
    if let Some(runtime) = preloaded_runtime {
        let control = format!("preload {}", runtime.display());
        if !marker.lines().any(|l| l == control) {
            broken.push(format!(
                "control failed: {} (run by nvhook-runtime) did not load LD_PRELOAD\n{marker}",
                runtime.display()
            ));
        }
    }
}

/// Deterministic noise (xorshift), so a failure reproduces.
fn pseudo_random(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Each directory nvhook writes in, linked by the image into a host directory bound at
/// /data, once per kind of volume: the host directory must not change. A volume bound at
/// /etc/ld.so.conf.d (a Kubernetes ConfigMap) costs the container nothing it needs. Neither
/// a host mount inside a volume nor a volume over the runtime's /dev tmpfs is written in.
fn volumes() -> Vec<Case> {
    fn cases<const K: usize>() -> Vec<Case> {
        vec![
            case(
                "issue 27: /etc, libdir, /usr/local/cuda -> /data (volume)",
                Glibc,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/etc", "/data");
                    p.link(LIBDIR, "/data/lib");
                    p.link("/usr/local/cuda", "/data");
                },
                Refused(INTO_VOLUME),
            ),
            case(
                "libdir -> /data/lib (volume)",
                Busybox,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link(LIBDIR, "/data/lib");
                },
                Refused(INTO_VOLUME),
            ),
            case(
                "/usr/bin -> /data/lib (volume)",
                Busybox,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/usr/bin", "/data/lib");
                },
                Refused(INTO_VOLUME),
            ),
            case(
                "/etc -> /data (volume)",
                Busybox,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/etc", "/data");
                },
                Refused(INTO_VOLUME),
            ),
            case(
                "/etc/ld.so.conf.d -> /data (volume)",
                Glibc,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/etc/ld.so.conf.d", "/data");
                },
                Starts,
            ),
            case(
                "/etc/ld.so.conf.d is a volume (a ConfigMap)",
                Glibc,
                |p| p.volume("/etc/ld.so.conf.d", VOLUME_KINDS[K]),
                Starts,
            ),
            case(
                "/lib/firmware -> /data (volume)",
                Glibc,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/usr/lib/firmware", "/data");
                },
                Refused(INTO_VOLUME),
            ),
            case(
                "/etc/OpenCL -> /data (volume)",
                Glibc,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/etc/OpenCL", "/data");
                },
                Refused(INTO_VOLUME),
            ),
            case(
                "/usr/share/glvnd -> /data (volume)",
                Glibc,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/usr/share/glvnd", "/data");
                },
                Refused(INTO_VOLUME),
            ),
            case(
                "/usr/local/cuda -> /data (volume with a newer compat libcuda)",
                Glibc,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/usr/local/cuda", "/data");
                },
                // Seen as the container sees it: the volume's compat driver is newer.
                StartsLoading("/data/compat/libcuda.so.999.0.0"),
            ),
            case(
                "issue 27 through nvhook-runtime",
                Glibc,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/etc", "/data");
                    p.link(LIBDIR, "/data/lib");
                    p.via_nvhook_runtime(Vec::new());
                },
                Refused(INTO_VOLUME),
            ),
            case(
                "issue 27 through nvhook-runtime's cdi mode",
                Glibc,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/etc", "/data");
                    p.link(LIBDIR, "/data/lib");
                    p.via_nvhook_runtime_cdi_mode();
                },
                Refused(INTO_VOLUME),
            ),
            case(
                "/etc -> /data (volume), nvhook-runtime's cdi mode",
                Glibc,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/etc", "/data");
                    p.via_nvhook_runtime_cdi_mode();
                },
                Refused(INTO_VOLUME),
            ),
            case(
                "/etc -> /data (volume), utility only: the loader cache is the write",
                Glibc,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/etc", "/data");
                    p.env("NVIDIA_DRIVER_CAPABILITIES=utility".into());
                },
                Refused("cannot write /etc/ld.so.cache"),
            ),
            // nvhook-runtime plans from the bundle, where /data is still empty: no loader cache,
            // so no cache entries; the createRuntime hook then leaves the volume's cache as it
            // is (a cache with nothing to add is not rewritten) and the container starts with
            // its GPU (utility asks for no libcuda to load).
            case(
                "/etc -> /data (volume), utility only, the createContainer hook",
                Busybox,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/etc", "/data");
                    p.env("NVIDIA_DRIVER_CAPABILITIES=utility".into());
                    p.via_nvhook_runtime_cdi_mode();
                },
                Starts,
            ),
            case(
                "/etc/ld.so.conf.d is a volume, nvhook-runtime's cdi mode",
                Glibc,
                |p| {
                    p.volume("/etc/ld.so.conf.d", VOLUME_KINDS[K]);
                    p.via_nvhook_runtime_cdi_mode();
                },
                Starts,
            ),
            case(
                "/run -> /data (volume)",
                Glibc,
                |p| {
                    p.volume("/data", VOLUME_KINDS[K]);
                    p.link("/run", "/data");
                },
                Refused(INTO_VOLUME),
            ),
            // The volume's host directory has a bind mount of its own at lib/, which the
            // spec does not list: a mount that is no bind of the spec is not the container's
            // own either. Even `ro` leaves it writable (runc's `ro` is not recursive).
            case(
                "libdir -> /data/lib, a host mount inside the volume",
                Busybox,
                |p| {
                    p.volume_with_mount_inside("/data", VOLUME_KINDS[K], "lib");
                    p.link(LIBDIR, "/data/lib");
                },
                Refused(INTO_MOUNT_IN_VOLUME),
            ),
            // runc's own /dev tmpfs comes first in the spec, the volume over it last: the last
            // entry at a place says what is mounted there. runc makes no device node in a /dev
            // the spec binds (it would fail on the missing /dev/null after the hooks).
            case(
                "/dev is a volume, after runc's /dev tmpfs",
                Busybox,
                |p| p.volume("/dev", VOLUME_KINDS[K]),
                Refused(INTO_DEV_VOLUME),
            ),
        ]
        .into_iter()
        .map(|mut c| {
            let kind = VOLUME_KINDS[K].join(",");
            c.name = Box::leak(format!("{} [{kind}]", c.name).into_boxed_str());
            c
        })
        .collect()
    }
    [cases::<0>(), cases::<1>(), cases::<2>()]
        .into_iter()
        .flatten()
        .collect()
}

// ------------------------------------------------------------------ running a case

fn image(base: Base) -> &'static support::Image {
    match base {
        Glibc => glibc_image(),
        Busybox => busybox_image(),
    }
}

fn command(base: Base) -> Vec<&'static str> {
    match base {
        Glibc => vec!["/gpucheck", "--dev", "/dev/nvidia0"],
        // busybox's cat names the errno: ENXIO means the cgroup let it through.
        Busybox => vec![
            "sh",
            "-c",
            "cat /dev/nvidia0 2>&1 | grep -q 'No such device or address' && echo 'dev /dev/nvidia0 ENXIO'",
        ],
    }
}

/// What happened, for the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Started,
    Refused,
    RuncRefused,
}

/// Runs one case. Ok: what happened and the hook's refusal line, if any; Err: every broken
/// promise, with the run's output.
fn run_case(node: &SimNode, c: &Case) -> Result<(Outcome, String), String> {
    let mut bundle = Bundle::new(image(c.base), &command(c.base));
    let canary = bundle.dir().join("canary");
    let version = node.driver_version();
    fill_canary(&canary, &version);
    if let Busybox = c.base {
        fs::write(bundle.rootfs().join("etc/debian_version"), "12.0\n").expect("debian_version");
    }
    let rootfs = bundle.rootfs().to_owned();
    let plant = Plant {
        rootfs: &rootfs,
        canary: &canary,
        version: &version,
        never_opened: RefCell::default(),
        env: RefCell::default(),
        shim_env: RefCell::default(),
        swaps: RefCell::default(),
        volumes: RefCell::default(),
        nested: RefCell::default(),
        host_libcuda: node
            .driver_root()
            .join(format!("usr/lib/x86_64-linux-gnu/libcuda.so.{version}")),
        node_config: node.config(),
    };
    (c.plant)(&plant);
    let volumes = plant.volumes.take();
    let nested = plant.nested.take();
    for (at, source, options) in &volumes {
        bundle.volume(at, source, options);
    }
    let watches: Vec<(PathBuf, OpenWatch)> = plant
        .never_opened
        .take()
        .into_iter()
        .map(|p| {
            let w = OpenWatch::new(&p);
            (p, w)
        })
        .collect();
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=0")
        .env("NVIDIA_DRIVER_CAPABILITIES=all");
    for var in plant.env.take() {
        bundle.env(&var);
    }
    let shim_env = plant.shim_env.take();
    let shim_preloaded = shim_env
        .as_ref()
        .is_some_and(|vars| vars.iter().any(|(k, _)| *k == "LD_PRELOAD"));
    let config = node.config().display().to_string();
    let runc = require_program("runc");
    let (runtime, vars): (&Path, Vec<(&str, String)>) = match shim_env {
        Some(mut vars) => {
            if !vars.iter().any(|(k, _)| *k == "NVHOOK_CONFIG") {
                vars.push(("NVHOOK_CONFIG", config));
            }
            (support::engines::nvhook_runtime_bin(), vars)
        }
        None => {
            bundle.prestart_hook(node);
            (&runc, Vec::new())
        }
    };
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();

    // The nested mounts are made in the namespace only: they end with it, whatever happens.
    let ns = MountNs::with_setup(RuntimeEnv::CgroupV1, &mount_commands(&nested));
    let (canary_before, host_before, table_before) =
        (Snapshot::tree(&canary), host_snapshot(), ns.table());
    let volumes_before: Vec<Snapshot> = volumes.iter().map(|v| Snapshot::tree(&v.1)).collect();
    let mut out = with_swaps(&plant.swaps.take(), || {
        run_in_ns(&bundle, &ns, runtime, &vars)
    });
    let (canary_after, host_after, table_after) =
        (Snapshot::tree(&canary), host_snapshot(), ns.table());
    let mut broken = Vec::new();
    for (before, (at, source, _)) in volumes_before.iter().zip(&volumes) {
        broken.extend(
            before
                .diff(&Snapshot::tree(source))
                .into_iter()
                .map(|d| format!("the volume at {at} changed: {d}")),
        );
    }
    for (at, source, _) in &volumes {
        broken.extend(
            nvidia_entries(source)
                .into_iter()
                .map(|e| format!("nvhook wrote in the volume at {at}: {}", e.display())),
        );
    }
    for (mount_point, inner) in &nested {
        let written: Vec<PathBuf> = fs::read_dir(inner)
            .expect("list a nested mount's source")
            .map(|e| e.expect("a nested mount's entry").path())
            .collect();
        if !written.is_empty() {
            broken.push(format!(
                "the host directory mounted at {} was written: {} entries, {:?}, ...",
                mount_point.display(),
                written.len(),
                &written[..written.len().min(4)]
            ));
        }
        unmount_in(&ns, mount_point, &mut broken);
    }
    out.hook_log = Some(hook_log_of(node, bundle.id()));
    broken.extend(
        canary_before
            .diff(&canary_after)
            .into_iter()
            .map(|d| format!("canary changed: {d}")),
    );
    broken.extend(
        host_before
            .diff(&host_after)
            .into_iter()
            .map(|d| format!("host changed: {d}")),
    );
    broken.extend(
        table_diff(&table_before, &table_after)
            .into_iter()
            .map(|d| format!("mount table changed: {d}")),
    );
    let leaked = host_mounts_referencing(&[bundle.dir(), node.root()]);
    broken.extend(
        leaked
            .into_iter()
            .map(|l| format!("mount left on the host: {l}")),
    );
    for (path, watch) in &watches {
        if watch.opened() {
            broken.push(format!("something opened {}", path.display()));
        }
    }
    let runc_real = fs::canonicalize(&runc).expect("resolve runc's path");
    check_marker(
        bundle.dir(),
        shim_preloaded.then_some(runc_real.as_path()),
        &mut broken,
    );
    let outcome = check_expectation(c, &out, &mut broken);
    if broken.is_empty() {
        Ok((outcome, refusal_line(&out).unwrap_or_default()))
    } else {
        Err(format!("{}\n{out}", broken.join("\n")))
    }
}

/// The shell commands that make the nested mounts, for `MountNs::with_setup`.
fn mount_commands(nested: &[(PathBuf, PathBuf)]) -> String {
    let quoted = |p: &Path| {
        let p = p.display().to_string();
        assert!(!p.contains('\''), "a quote in {p}");
        format!("'{p}'")
    };
    nested
        .iter()
        .map(|(mount_point, inner)| {
            format!("mount --bind {} {}", quoted(inner), quoted(mount_point))
        })
        .chain(["true".to_string()])
        .collect::<Vec<_>>()
        .join(" && ")
}

/// Unmounts `mount_point` (and whatever is mounted under it) in the namespace `ns`.
fn unmount_in(ns: &MountNs, mount_point: &Path, broken: &mut Vec<String>) {
    let out = std::process::Command::new(&ns.nsenter()[0])
        .args(&ns.nsenter()[1..])
        .arg(require_program("umount"))
        .arg("--recursive")
        .arg(mount_point)
        .output()
        .expect("spawn umount");
    if !out.status.success() {
        broken.push(format!(
            "could not unmount the nested mount at {}: {}",
            mount_point.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
}

/// Every entry under `dir` whose name starts with `nvidia`, links not followed.
fn nvidia_entries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with("nvidia") {
            found.push(path.clone());
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(nvidia_entries(&path));
        }
    }
    found
}

/// Exchanges made by racing threads, over the whole run.
static SWAPS: AtomicU64 = AtomicU64::new(0);

/// Runs `f` while a thread exchanges each pair of `swaps` as fast as it can.
fn with_swaps<T>(swaps: &[(PathBuf, PathBuf)], f: impl FnOnce() -> T) -> T {
    if swaps.is_empty() {
        return f();
    }
    let stop = AtomicBool::new(false);
    let pairs: Vec<(CString, CString)> = swaps
        .iter()
        .map(|(a, b)| {
            let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).expect("path");
            (c(a), c(b))
        })
        .collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                for (a, b) in &pairs {
                    // SAFETY: both paths are NUL-terminated.
                    let rc = unsafe {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            a.as_ptr(),
                            libc::AT_FDCWD,
                            b.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                    n += u64::from(rc == 0);
                }
            }
            SWAPS.fetch_add(n, Ordering::Relaxed);
        });
        let result = f();
        stop.store(true, Ordering::Relaxed);
        result
    })
}

/// The node's log lines about this container (the node is shared by parallel cases).
fn hook_log_of(node: &SimNode, id: &str) -> String {
    node.log()
        .lines()
        .filter(|l| l.contains(id))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The hook's one-line message as runc relays it (runc escapes the newline after it), or
/// nvhook-runtime's, which refuses before runc runs.
fn refusal_line(out: &Output) -> Option<String> {
    let rest = ["nvhook: ", "nvhook-runtime: "]
        .iter()
        .find_map(|prefix| out.stderr.split(prefix).nth(1))?;
    let end = rest
        .find("\\n")
        .or_else(|| rest.find('\n'))
        .unwrap_or(rest.len());
    Some(rest[..end].to_owned())
}

fn check_expectation(c: &Case, out: &Output, broken: &mut Vec<String>) -> Outcome {
    let all = format!("{}{}", out.stderr, out.hook_log.as_deref().unwrap_or(""));
    if all.contains("panicked") || all.contains("signal: ") {
        broken.push("the hook crashed".into());
    }
    let hook_line = refusal_line(out);
    let started = out.status.success();
    let outcome = match (started, &hook_line) {
        (true, _) => Outcome::Started,
        (false, Some(_)) => Outcome::Refused,
        (false, None) => Outcome::RuncRefused,
    };
    match (&c.expect, outcome) {
        (Starts | StartsLoading(_), Outcome::Started) => {
            let mut want = vec!["dev /dev/nvidia0 ENXIO".to_string()];
            if let Glibc = c.base {
                want.extend(["dlopen libcuda.so.1 ok", "cuInit 0"].map(String::from));
            }
            if let StartsLoading(file) = c.expect {
                want.push(format!("dlopen libcuda.so.1 file {file}"));
            }
            for line in want {
                if !out.has_line(&line) {
                    broken.push(format!("started without {line:?}"));
                }
            }
        }
        (Refused(text), Outcome::Refused) => {
            let line = hook_line.unwrap_or_default();
            if !line.contains(text) {
                broken.push(format!(
                    "refused with {line:?}, which does not name {text:?}"
                ));
            }
        }
        (StartsOrRefused, Outcome::Started | Outcome::Refused) => {}
        (RuncRefuses(text), Outcome::RuncRefused) => {
            if !out.stderr.contains(text) {
                broken.push(format!("runc's error does not name {text:?}"));
            }
        }
        (want, got) => broken.push(format!("expected {want:?}, got {got:?}")),
    }
    if outcome != Outcome::Started && out.stdout.contains("dev /dev/nvidia0") {
        broken.push("refused, yet the container ran".into());
    }
    outcome
}

// ------------------------------------------------------------------ the suite

/// Every case of every class, on a few threads; one summary line per class, and every
/// failure with its case name.
#[test]
fn hostile_images_leave_the_host_untouched() {
    let classes: Vec<(&str, Vec<Case>)> = vec![
        ("library directory", library_directory()),
        ("/usr/bin", usr_bin()),
        ("/etc", etc()),
        ("/etc/ld.so.cache", ld_so_cache()),
        ("/etc/ld.so.conf.d", ld_so_conf_d()),
        ("/lib/firmware", firmware()),
        ("/proc/driver", proc_driver()),
        ("/run sockets", run_sockets()),
        ("loops and long chains", loops_and_chains()),
        ("file or directory", file_or_directory()),
        ("device nodes and FIFOs", special_files()),
        ("hard links", hard_links()),
        ("garbage ld.so.cache", garbage_ld_so_cache()),
        ("LD_PRELOAD / LD_LIBRARY_PATH", loader_environment()),
        ("volumes behind image links", volumes()),
    ];
    run_suite(&classes, 4);
}

/// Starts through the hook while the library directory, /usr/bin and /etc/ld.so.cache
/// trade places with links to the canary (absolute and relative) and to the host's own
/// copies. One start at a time: each racing thread takes a core.
#[test]
fn targets_swapped_for_links_while_the_hook_runs() {
    const STARTS: usize = 24;
    let racing: Vec<Case> = (0..STARTS)
        .map(|_| {
            case(
                "swap targets for links",
                Busybox,
                plant_race,
                StartsOrRefused,
            )
        })
        .collect();
    let before = SWAPS.load(Ordering::Relaxed);
    run_suite(&[("racing swaps", racing)], 1);
    let swaps = SWAPS.load(Ordering::Relaxed) - before;
    eprintln!("racing swaps: {swaps} exchanges over {STARTS} starts");
    assert!(
        swaps >= STARTS as u64,
        "the racing thread hardly ran: {swaps} exchanges"
    );
}

fn plant_race(p: &Plant) {
    // A genuine cache, so the hook reads and rewrites it.
    let cache = glibc_image().rootfs().join("etc/ld.so.cache");
    fs::copy(cache, p.path("/etc/ld.so.cache")).expect("copy cache");
    p.dir(LIBDIR);
    p.dir("/usr/bin");
    p.swap_during_run(LIBDIR, "/usr/lib/.decoy-abs", &p.canary_abs(LIBDIR));
    p.swap_during_run(
        "/usr/bin",
        "/usr/.decoy-bin",
        &p.canary_rel("/usr/.decoy-bin", "/usr/bin"),
    );
    p.swap_during_run(
        "/etc/ld.so.cache",
        "/etc/.decoy-cache",
        &p.host_rel("/etc/ld.so.cache"),
    );
}

/// Runs `classes` on `workers` threads and fails with every broken case.
fn run_suite(classes: &[(&str, Vec<Case>)], workers: usize) {
    require_root();
    let started = Instant::now();
    let node = SimNode::create(2);
    // Images are built once, before the threads race for them.
    let _ = (glibc_image(), busybox_image());
    let jobs: Vec<(&str, &Case)> = classes
        .iter()
        .flat_map(|(class, cases)| cases.iter().map(move |c| (*class, c)))
        .collect();
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                while let Some(&(class, c)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let r = run_case(&node, c);
                    if let Ok((outcome, line)) = &r {
                        eprintln!("{class} / {}: {outcome:?} {line}", c.name);
                    }
                    results.lock().unwrap().push((class, c.name, r));
                }
            });
        }
    });
    let results = results.into_inner().unwrap();
    for (class, cases) in classes {
        let of = |o: Outcome| {
            results
                .iter()
                .filter(|(cl, _, r)| cl == class && r.as_ref().is_ok_and(|(got, _)| *got == o))
                .count()
        };
        eprintln!(
            "{class}: {} cases, {} started, {} refused by nvhook, {} refused by runc",
            cases.len(),
            of(Outcome::Started),
            of(Outcome::Refused),
            of(Outcome::RuncRefused),
        );
    }
    eprintln!(
        "{} cases in {:.1} s",
        results.len(),
        started.elapsed().as_secs_f64()
    );
    let failures: Vec<String> = results
        .iter()
        .filter_map(|(class, name, r)| {
            r.as_ref()
                .err()
                .map(|e| format!("=== {class} / {name}\n{e}"))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        results.len(),
        failures.join("\n")
    );
}

/// The observers themselves: each sees the change it exists to catch.
#[test]
fn observers_see_what_they_watch() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = MountNs::new(RuntimeEnv::CgroupV1);
    let before = ns.table();
    let status = std::process::Command::new(ns.nsenter()[0].clone())
        .args(&ns.nsenter()[1..])
        .arg(require_program("mount"))
        .args(["-t", "tmpfs", "none"])
        .arg(dir.path())
        .status()
        .expect("spawn mount");
    assert!(status.success());
    assert_eq!(table_diff(&before, &ns.table()).len(), 1);
    assert!(
        host_mounts_referencing(&[dir.path()]).is_empty(),
        "the namespace is not private"
    );

    let file = dir.path().join("f");
    fs::write(&file, "same size A").expect("write");
    let snap = Snapshot::tree(dir.path());
    fs::write(&file, "same size B").expect("write");
    assert_eq!(snap.diff(&Snapshot::tree(dir.path())).len(), 1);

    let watch = OpenWatch::new(&file);
    assert!(!watch.opened());
    fs::read(&file).expect("read");
    assert!(watch.opened());
}
