//! The emulated arm64 node (issue 29): an aarch64 simulated node, an arm64 glibc image and the
//! aarch64 nvhook, nvhook-runtime and nvhook-nvml, run with the native runc. The kernel hands
//! every aarch64 program (the hook runc execs, the programs in the container) to qemu-aarch64
//! through binfmt_misc.
//!
//! What `scripts/build-arm64.sh` leaves in `.cross/aarch64` (`$NVHOOK_ARM64_OUT`) is the kit:
//! the three binaries, the aarch64 mock NVML and gpucheck, and `glibc/`, Debian's arm64 glibc.
//! The host side of an arm64 node has that glibc at `/usr/lib/aarch64-linux-gnu` and its loader
//! at `/lib/ld-linux-aarch64.so.1` (nvhook-nvml is a dynamic program: it loads libnvidia-ml);
//! this machine has not, so the tests run the engines in a mount namespace of their own whose
//! `/usr/lib` is an overlay of the host's and the kit's (nothing of the host changes).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::cmd::run_checked;
use super::image::{Image, image_dir, source};
use super::mountns::MountNs;
use super::node::{NodeOptions, SimNode};
use super::runc::RuntimeEnv;

/// The Debian multiarch directory of an arm64 host and image.
pub const LIB_DIR: &str = "/usr/lib/aarch64-linux-gnu";

/// Debian's arm64 ldconfig in the toolchain root (scripts/arm64-toolchain.sh).
const LDCONFIG: &str = "opt/arm64-libc-bin/usr/sbin/ldconfig";

/// Debian sid's qemu-aarch64 as scripts/arm64-binfmt.sh registers it: Debian 12's qemu 7.2
/// lacks the new mount API nvhook mounts with.
const BINFMT: &str = "/proc/sys/fs/binfmt_misc/nvhook-qemu-aarch64";

pub struct Arm64 {
    kit: PathBuf,
    cross_root: PathBuf,
}

impl Arm64 {
    /// The kit and toolchain, checked once: a missing piece fails the test with the command
    /// that makes it (the tests never skip).
    pub fn require() -> &'static Arm64 {
        static KIT: OnceLock<Arm64> = OnceLock::new();
        KIT.get_or_init(|| {
            let project = source("..");
            let kit = std::env::var_os("NVHOOK_ARM64_OUT")
                .map_or_else(|| project.join(".cross/aarch64"), PathBuf::from);
            let cross_root = std::env::var_os("NVHOOK_CROSS_ROOT")
                .map_or_else(|| project.join(".cross/sid-root"), PathBuf::from);
            let make = "run scripts/arm64-toolchain.sh and scripts/build-arm64.sh as root \
                        (bash scripts/test.sh does both)";
            for name in [
                "nvhook",
                "nvhook-runtime",
                "nvhook-nvml",
                "libmock_nvml.so",
                "gpucheck",
                "glibc/lib/ld-linux-aarch64.so.1",
            ] {
                let path = kit.join(name);
                assert!(path.exists(), "{} is missing: {make}", path.display());
            }
            for tool in [LDCONFIG, "opt/arm64-busybox/usr/bin/busybox"] {
                assert!(
                    cross_root.join(tool).is_file(),
                    "{} has no {tool}: {make}",
                    cross_root.display()
                );
            }
            let binfmt = fs::read_to_string(BINFMT).unwrap_or_default();
            assert!(
                binfmt.starts_with("enabled")
                    && binfmt
                        .lines()
                        .any(|l| l.starts_with("flags:") && l.contains('F')),
                "sid's qemu-aarch64 is not registered in binfmt_misc with the F flag ({BINFMT}): \
                 run scripts/arm64-binfmt.sh as root (bash scripts/test.sh does)"
            );
            let arm64 = Arm64 { kit, cross_root };
            // Registered is not enough: another registration of the format (Debian's 7.2,
            // enabled again) may be the one the kernel picks. The script puts sid's in front,
            // or says in one line which entry it cannot get past.
            if arm64.qemu_in_use() != arm64.sid_qemu() {
                let out = std::process::Command::new(project.join("scripts/arm64-binfmt.sh"))
                    .output()
                    .expect("run scripts/arm64-binfmt.sh");
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                assert_eq!(arm64.qemu_in_use(), arm64.sid_qemu());
            }
            arm64
        })
    }

    pub fn nvhook(&self) -> PathBuf {
        self.kit.join("nvhook")
    }

    /// The version line of the qemu the kernel runs aarch64 programs with: any qemu-user
    /// prints it and exits when QEMU_VERSION is set.
    fn qemu_in_use(&self) -> String {
        let ld_so = self.kit.join("glibc/lib/ld-linux-aarch64.so.1");
        first_line(std::process::Command::new(ld_so).env("QEMU_VERSION", "1"))
    }

    /// The version line of sid's qemu-aarch64.
    fn sid_qemu(&self) -> String {
        first_line(
            std::process::Command::new(self.cross_root.join("opt/qemu/qemu-aarch64"))
                .arg("--version"),
        )
    }

    /// Debian's arm64 busybox (static), from the toolchain root.
    pub fn busybox(&self) -> PathBuf {
        self.cross_root.join("opt/arm64-busybox/usr/bin/busybox")
    }

    pub fn runtime(&self) -> PathBuf {
        self.kit.join("nvhook-runtime")
    }

    /// An arm64 simulated node of `gpus` GPUs (`extra`: more simnode flags) whose config and
    /// hook entries name the aarch64 nvhook.
    pub fn node(&self, gpus: u32, extra: &[&str]) -> SimNode {
        let mut flags: Vec<String> = vec![
            "--arch".into(),
            "aarch64".into(),
            "--cross-root".into(),
            self.cross_root.display().to_string(),
            "--mock-nvml".into(),
            self.kit.join("libmock_nvml.so").display().to_string(),
        ];
        flags.extend(extra.iter().map(|f| f.to_string()));
        SimNode::build(&NodeOptions {
            hook: Some(self.nvhook()),
            flags,
            ..NodeOptions::gpus(gpus)
        })
    }

    /// A mount namespace laid out as an arm64 host's: the kit's glibc under `/usr/lib` (an
    /// overlay on the host's, read-only), its loader at `/lib/ld-linux-aarch64.so.1`.
    pub fn host_ns(&self, env: RuntimeEnv) -> MountNs {
        let glibc = self.kit.join("glibc/usr/lib");
        MountNs::with_setup(
            env,
            &format!(
                "mount -t overlay -o ro,lowerdir=/usr/lib:{} overlay /usr/lib",
                glibc.display()
            ),
        )
    }

    /// A Debian-like arm64 image: Debian's arm64 glibc, `/gpucheck` (aarch64), and a loader
    /// cache written by Debian's arm64 ldconfig.
    pub fn image(&self) -> &'static Image {
        static IMAGE: OnceLock<Image> = OnceLock::new();
        IMAGE.get_or_init(|| {
            let rootfs = image_dir("arm64-glibc").join("rootfs");
            run_checked(
                Command::new("cp")
                    .arg("-a")
                    .arg(self.kit.join("glibc"))
                    .arg(&rootfs),
            );
            for dir in ["usr/bin", "usr/sbin", "proc", "dev", "sys", "tmp"] {
                fs::create_dir_all(rootfs.join(dir)).expect("create image directory");
            }
            for (link, target) in [("bin", "usr/bin"), ("sbin", "usr/sbin")] {
                symlink(target, rootfs.join(link)).expect("usr-merge symlink");
            }
            fs::copy(self.kit.join("gpucheck"), rootfs.join("gpucheck")).expect("copy gpucheck");
            // nvhook picks the library directory from this file (Debian family).
            fs::copy("/etc/debian_version", rootfs.join("etc/debian_version"))
                .expect("copy /etc/debian_version");
            fs::write(
                rootfs.join("etc/ld.so.conf"),
                "include /etc/ld.so.conf.d/*.conf\n",
            )
            .expect("write ld.so.conf");
            run_checked(
                Command::new(self.cross_root.join(LDCONFIG))
                    .arg("-r")
                    .arg(&rootfs),
            );
            Image::at(rootfs)
        })
    }

    /// `ldconfig -p` of the arm64 cache at `cache` (an image's, a container's).
    pub fn ldconfig_listing(&self, cache: &Path) -> String {
        super::cmd::stdout_of(
            Command::new(self.cross_root.join(LDCONFIG))
                .arg("-C")
                .arg(cache)
                .arg("-p"),
        )
    }
}

fn first_line(command: &mut std::process::Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().unwrap_or_default().to_string()
}
