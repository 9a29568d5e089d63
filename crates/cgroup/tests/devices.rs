//! Root integration tests for `nvhook_cgroup::allow_devices`, against the real kernel.
//!
//! A `mknod c 195 N` node has no driver behind it, so opening it from inside a cgroup
//! fails with ENXIO when the cgroup allows the device and with EPERM when it does not:
//! that difference proves the rules both ways. Each scenario makes its own cgroup with a
//! deny-by-default policy, puts a sleeping process in it for `allow_devices` to find, and
//! opens nodes from short-lived processes that first move themselves into the cgroup.

use nvhook_cgroup::bpf::kept::{Keeping, keeping};
use nvhook_cgroup::bpf::{
    attach_device_program, attached_device_programs, insn::Insn, interp::runc_program,
};
use nvhook_cgroup::{Access, CgroupVersion, DeviceKind, DeviceRule, allow_devices};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

const NVIDIA_MAJOR: u32 = 195;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests need root: run `sudo cargo test --test cgroup_devices`"
    );
}

#[derive(Debug, PartialEq, Eq)]
enum Open {
    /// The cgroup allowed it; the open succeeded (a real device).
    Ok,
    /// The cgroup allowed it; no driver answered (ENXIO).
    NoDriver,
    /// The cgroup denied it (EPERM).
    Denied,
}

/// Opens `node` from a new process that first joins the cgroup whose `cgroup.procs` is
/// `procs`.
fn open_from_cgroup(procs: &Path, node: &Path) -> Open {
    let out = Command::new("sh")
        .args(["-c", r#"echo $$ > "$1" && exec cat "$2""#, "sh"])
        .arg(procs)
        .arg(node)
        .output()
        .expect("spawn sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    match () {
        _ if out.status.success() => Open::Ok,
        _ if stderr.contains("No such device or address") => Open::NoDriver,
        _ if stderr.contains("Operation not permitted") => Open::Denied,
        _ => panic!(
            "opening {} from the cgroup failed unexpectedly: {stderr}",
            node.display()
        ),
    }
}

fn mknod_char(dir: &Path, major: u32, minor: u32) -> PathBuf {
    let path = dir.join(format!("dev-{major}-{minor}"));
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: c_path is a valid NUL-terminated string.
    let rc = unsafe {
        libc::mknod(
            c_path.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    assert_eq!(
        rc,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    path
}

/// A test cgroup with a sleeping member; killed and removed on drop, pass or fail.
struct TestCgroup {
    dir: PathBuf,
    sleeper: Child,
}

impl TestCgroup {
    fn create(dir: PathBuf) -> TestCgroup {
        // A leftover from an interrupted run would make mkdir fail.
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let sleeper = Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        TestCgroup { dir, sleeper }
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    fn enter_sleeper(&self) -> i32 {
        std::fs::write(self.procs(), self.sleeper.id().to_string())
            .expect("move sleeper into cgroup");
        self.sleeper.id() as i32
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = self.sleeper.kill();
        let _ = self.sleeper.wait();
        // The cgroup empties as its last task exits, which can lag the reap slightly.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("could not remove test cgroup {}", self.dir.display());
    }
}

fn gpu0_rw() -> DeviceRule {
    DeviceRule {
        kind: DeviceKind::Char,
        major: NVIDIA_MAJOR,
        minor: 0,
        access: Access::RW,
    }
}

#[test]
fn v1_devices_allow_lets_exactly_the_rule_through() {
    require_root();
    let hierarchy = Path::new("/sys/fs/cgroup/devices");
    assert!(
        hierarchy.join("devices.allow").exists(),
        "no cgroup v1 devices hierarchy at {}: this test needs a cgroup v1 host",
        hierarchy.display()
    );
    let nodes = tempfile::tempdir().unwrap();
    let gpu0 = mknod_char(nodes.path(), NVIDIA_MAJOR, 0);
    let gpu1 = mknod_char(nodes.path(), NVIDIA_MAJOR, 1);

    let cgroup = TestCgroup::create(hierarchy.join(format!("nvhook-test-{}", std::process::id())));
    std::fs::write(cgroup.dir.join("devices.deny"), "a").expect("deny all devices");
    let pid = cgroup.enter_sleeper();
    assert_eq!(
        open_from_cgroup(&cgroup.procs(), &gpu0),
        Open::Denied,
        "deny-all is not in force"
    );

    assert_eq!(
        allow_devices(pid, &[gpu0_rw()], None).unwrap(),
        CgroupVersion::V1
    );

    assert_eq!(open_from_cgroup(&cgroup.procs(), &gpu0), Open::NoDriver);
    assert_eq!(open_from_cgroup(&cgroup.procs(), &gpu1), Open::Denied);
    let list = std::fs::read_to_string(cgroup.dir.join("devices.list")).unwrap();
    assert_eq!(list.trim(), "c 195:0 rw");
}

/// runc's device program for an allow-list holding only /dev/null (c 1:3 rwm).
fn runc_deny_all_but_null() -> Vec<Insn> {
    runc_program(&[(DeviceKind::Char, Some(1), Some(3), "rwm")], false)
}

/// Gives the calling thread (only) a private mount namespace with cgroup2 over
/// /sys/fs/cgroup: `unshare -m` for one thread, so that on a hybrid host the v1
/// hierarchies are hidden as they are on a pure cgroup v2 host, and processes spawned
/// from this thread see the same.
fn enter_private_cgroup2_namespace() {
    // SAFETY: plain syscalls on static, NUL-terminated strings.
    unsafe {
        assert_eq!(
            libc::unshare(libc::CLONE_NEWNS),
            0,
            "unshare: {}",
            std::io::Error::last_os_error()
        );
        let rc = libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        );
        assert_eq!(rc, 0, "make / private: {}", std::io::Error::last_os_error());
        let rc = libc::mount(
            c"none".as_ptr(),
            c"/sys/fs/cgroup".as_ptr(),
            c"cgroup2".as_ptr(),
            0,
            std::ptr::null(),
        );
        assert_eq!(rc, 0, "mount cgroup2: {}", std::io::Error::last_os_error());
    }
}

fn v2_scenario() {
    enter_private_cgroup2_namespace();
    let nodes = tempfile::tempdir().unwrap();
    let gpu0 = mknod_char(nodes.path(), NVIDIA_MAJOR, 0);
    let gpu1 = mknod_char(nodes.path(), NVIDIA_MAJOR, 1);

    let cgroup = TestCgroup::create(PathBuf::from(format!(
        "/sys/fs/cgroup/nvhook-test-{}",
        std::process::id()
    )));
    let original = attach_device_program(&cgroup.dir, &runc_deny_all_but_null()).unwrap();
    let pid = cgroup.enter_sleeper();
    assert_eq!(
        open_from_cgroup(&cgroup.procs(), &gpu0),
        Open::Denied,
        "the runc-style program is not in force"
    );
    assert_eq!(
        open_from_cgroup(&cgroup.procs(), Path::new("/dev/null")),
        Open::Ok
    );

    assert_eq!(
        allow_devices(pid, &[gpu0_rw()], None).unwrap(),
        CgroupVersion::V2
    );

    assert_eq!(open_from_cgroup(&cgroup.procs(), &gpu0), Open::NoDriver);
    assert_eq!(open_from_cgroup(&cgroup.procs(), &gpu1), Open::Denied);
    assert_eq!(
        open_from_cgroup(&cgroup.procs(), Path::new("/dev/null")),
        Open::Ok
    );
    let attached = attached_device_programs(&cgroup.dir).unwrap();
    assert_eq!(
        attached.len(),
        1,
        "exactly one device program must remain: {attached:?}"
    );
    assert_ne!(
        attached[0], original,
        "the runtime's program must have been replaced"
    );
}

#[test]
fn v2_device_program_is_replaced_with_one_that_also_allows_the_rule() {
    require_root();
    // A thread of its own, so the namespace never leaks into other tests, even when the
    // harness runs tests on its main thread (--test-threads=1).
    std::thread::spawn(v2_scenario)
        .join()
        .expect("v2 scenario failed");
}

#[test]
fn v2_without_a_device_program_changes_nothing() {
    require_root();
    std::thread::spawn(|| {
        enter_private_cgroup2_namespace();
        let cgroup = TestCgroup::create(PathBuf::from(format!(
            "/sys/fs/cgroup/nvhook-test-{}-none",
            std::process::id()
        )));
        let pid = cgroup.enter_sleeper();
        assert_eq!(
            allow_devices(pid, &[gpu0_rw()], None).unwrap(),
            CgroupVersion::V2
        );
        assert!(attached_device_programs(&cgroup.dir).unwrap().is_empty());
    })
    .join()
    .expect("v2 no-program scenario failed");
}

/// A cgroup under the private cgroup2 mount whose sleeping member runs under runc's
/// deny-all-but-null program.
fn runc_cgroup(name: &str) -> (TestCgroup, i32) {
    let cgroup = TestCgroup::create(PathBuf::from(format!(
        "/sys/fs/cgroup/nvhook-test-{}-{name}",
        std::process::id()
    )));
    attach_device_program(&cgroup.dir, &runc_deny_all_but_null()).unwrap();
    let pid = cgroup.enter_sleeper();
    (cgroup, pid)
}

/// The one device program attached to `cgroup`.
fn attached(cgroup: &TestCgroup) -> u32 {
    match attached_device_programs(&cgroup.dir).unwrap()[..] {
        [id] => id,
        ref ids => panic!("one device program expected: {ids:?}"),
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn kept_programs_scenario() {
    enter_private_cgroup2_namespace();
    let bpffs = tempfile::tempdir().unwrap();
    let c_bpffs = CString::new(bpffs.path().as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            c_bpffs.as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "mount bpffs: {}", std::io::Error::last_os_error());
    let kept = bpffs.path().join("nvhook");
    assert_eq!(
        keeping(&kept),
        Keeping::Kept(0),
        "a bpffs, nothing kept yet"
    );
    let nodes = tempfile::tempdir().unwrap();
    let gpu0 = mknod_char(nodes.path(), NVIDIA_MAJOR, 0);
    let gpu1 = mknod_char(nodes.path(), NVIDIA_MAJOR, 1);
    let gpu1_rw = DeviceRule {
        minor: 1,
        ..gpu0_rw()
    };
    let opens = |cgroup: &TestCgroup| {
        [&gpu0, &gpu1, Path::new("/dev/null")].map(|n| open_from_cgroup(&cgroup.procs(), n))
    };

    // The first container loads its program and keeps it.
    let (a, pid) = runc_cgroup("a");
    allow_devices(pid, &[gpu0_rw()], Some(&kept)).unwrap();
    assert_eq!(opens(&a), [Open::NoDriver, Open::Denied, Open::Ok]);
    let [name_a] = &entries(&kept)[..] else {
        panic!("one program kept: {:?}", entries(&kept));
    };
    let name_a = name_a.clone();
    assert_eq!(keeping(&kept), Keeping::Kept(1));

    // The next with the same rules attaches that one.
    let (b, pid) = runc_cgroup("b");
    allow_devices(pid, &[gpu0_rw()], Some(&kept)).unwrap();
    assert_eq!(attached(&b), attached(&a), "the kept program is attached");
    assert_eq!(opens(&b), [Open::NoDriver, Open::Denied, Open::Ok]);

    // Other rules: a program of their own, kept beside it.
    let (c, pid) = runc_cgroup("c");
    allow_devices(pid, &[gpu1_rw], Some(&kept)).unwrap();
    assert_ne!(attached(&c), attached(&a));
    assert_eq!(opens(&c), [Open::Denied, Open::NoDriver, Open::Ok]);
    let names = entries(&kept);
    let name_c = names
        .iter()
        .find(|n| **n != name_a)
        .expect("c's kept")
        .clone();

    // A program under another program's name is not attached, and goes.
    std::fs::rename(kept.join(&name_a), kept.join(&name_c)).unwrap();
    let (d, pid) = runc_cgroup("d");
    allow_devices(pid, &[gpu1_rw], Some(&kept)).unwrap();
    assert_ne!(attached(&d), attached(&a), "a's program, under c's name");
    assert_ne!(attached(&d), attached(&c), "c's pin was replaced");
    assert_eq!(opens(&d), [Open::Denied, Open::NoDriver, Open::Ok]);
    assert_eq!(entries(&kept), [name_c], "d's program, kept in its place");

    // A directory outside a bpffs keeps nothing and is not made.
    let elsewhere = nodes.path().join("nvhook");
    let (e, pid) = runc_cgroup("e");
    allow_devices(pid, &[gpu0_rw()], Some(&elsewhere)).unwrap();
    assert_ne!(attached(&e), attached(&a));
    assert_eq!(opens(&e), [Open::NoDriver, Open::Denied, Open::Ok]);
    assert!(!elsewhere.exists());
    assert_eq!(keeping(&elsewhere), Keeping::NoBpffs);
    drop([a, b, c, d, e]);
    // SAFETY: as above.
    unsafe { libc::umount2(c_bpffs.as_ptr(), libc::MNT_DETACH) };
}

#[test]
fn v2_programs_kept_in_a_bpffs_serve_the_next_container_with_the_same_rules() {
    require_root();
    std::thread::spawn(kept_programs_scenario)
        .join()
        .expect("kept programs scenario failed");
}
