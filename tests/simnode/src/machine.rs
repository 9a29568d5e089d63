//! The CPU architecture a node's driver is built for, and the tools that build it: the host's
//! own (`cc`, `/sbin/ldconfig`) for x86_64, and for aarch64 those of the Debian sid root that
//! `scripts/arm64-toolchain.sh` makes (its aarch64 cross gcc, run in the root, and Debian's
//! arm64 ldconfig, an aarch64 program that qemu-user runs through binfmt_misc).

use anyhow::{Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    #[value(name = "x86_64")]
    X86_64,
    Aarch64,
}

/// Where the arm64 ldconfig lies in the sid root (the toolchain script unpacks it there).
const ARM64_LDCONFIG: &str = "opt/arm64-libc-bin/usr/sbin/ldconfig";

impl Arch {
    /// The Debian multiarch directory of the driver's 64-bit libraries.
    pub fn lib_dir(self) -> &'static str {
        match self {
            Arch::X86_64 => "usr/lib/x86_64-linux-gnu",
            Arch::Aarch64 => "usr/lib/aarch64-linux-gnu",
        }
    }

    /// The directory of the compat32 (i386) libraries: x86_64 drivers only.
    pub fn lib_dir_32(self) -> Option<&'static str> {
        match self {
            Arch::X86_64 => Some("usr/lib/i386-linux-gnu"),
            Arch::Aarch64 => None,
        }
    }

    /// How `ldconfig -p` tags a 64-bit library of this architecture.
    pub fn cache_tag(self) -> &'static str {
        match self {
            Arch::X86_64 => "libc6,x86-64",
            Arch::Aarch64 => "libc6,AArch64",
        }
    }

    /// The name `uname -m` gives, which the kernel module's version line carries.
    pub fn uname(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }
}

/// The architecture and, for aarch64, the toolchain root.
#[derive(Debug, Clone)]
pub struct Toolchain {
    pub arch: Arch,
    cross_root: Option<PathBuf>,
    /// Where the driver's 64-bit libraries are installed (`--lib-dir`), where not in Debian's
    /// multiarch directory.
    lib_dir: Option<String>,
}

impl Toolchain {
    pub fn new(
        arch: Arch,
        cross_root: Option<PathBuf>,
        lib_dir: Option<String>,
    ) -> Result<Toolchain> {
        if let Some(dir) = &lib_dir
            && (dir.is_empty() || dir.starts_with('/') || dir.split('/').any(|c| c == ".."))
        {
            bail!(
                "--lib-dir {dir:?}: a directory under the driver root, e.g. usr/local/nvidia/lib64"
            );
        }
        match (arch, &cross_root) {
            (Arch::X86_64, Some(_)) => bail!("--cross-root is for --arch aarch64 only"),
            (Arch::Aarch64, None) => bail!(
                "--arch aarch64 needs --cross-root DIR, the Debian sid root of scripts/arm64-toolchain.sh"
            ),
            (Arch::Aarch64, Some(root)) if !root.join(ARM64_LDCONFIG).is_file() => bail!(
                "{} has no {ARM64_LDCONFIG}: run scripts/arm64-toolchain.sh",
                root.display()
            ),
            _ => Ok(Toolchain {
                arch,
                cross_root,
                lib_dir,
            }),
        }
    }

    /// A C compiler reading its source on stdin, and where it leaves `output`: the cross
    /// compiler runs in its root, which cannot see the node's directory, and writes the file
    /// on stdout.
    pub fn cc(&self, flags: &[String], output: &Path) -> (Command, Written) {
        let common = ["-x", "c", "-", "-x", "none", "-O1"];
        match &self.cross_root {
            None => {
                let mut cc = Command::new("cc");
                cc.args(common).arg("-o").arg(output).args(flags);
                (cc, Written::InPlace)
            }
            Some(root) => {
                let mut cc = Command::new("chroot");
                cc.arg(root).args([
                    "/bin/sh",
                    "-ec",
                    "out=$(mktemp) && trap 'rm -f \"$out\"' EXIT && aarch64-linux-gnu-gcc \"$@\" -o \"$out\" && cat \"$out\"",
                    "cc",
                ]);
                cc.args(common).args(flags);
                (cc, Written::OnStdout)
            }
        }
    }

    /// The directory of the driver's 64-bit libraries under the driver root.
    pub fn lib_dir(&self) -> &str {
        self.lib_dir.as_deref().unwrap_or(self.arch.lib_dir())
    }

    /// The directory of its compat32 libraries: none where `--lib-dir` moved the 64-bit ones
    /// (GKE's installer, the layout it stands for, installs no 32-bit libraries).
    pub fn lib_dir_32(&self) -> Option<&str> {
        match self.lib_dir {
            Some(_) => None,
            None => self.arch.lib_dir_32(),
        }
    }

    /// glibc's ldconfig for this architecture (it files only its own architecture's libraries).
    pub fn ldconfig(&self) -> PathBuf {
        match &self.cross_root {
            None => PathBuf::from("/sbin/ldconfig"),
            Some(root) => root.join(ARM64_LDCONFIG),
        }
    }
}

/// Where a compiler leaves its output.
pub enum Written {
    InPlace,
    OnStdout,
}

/// The file a compiler wrote on stdout, made executable (programs and libraries alike).
pub fn write_output(output: &Path, bytes: &[u8]) -> Result<()> {
    use anyhow::Context;
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(output, bytes).with_context(|| format!("cannot write {}", output.display()))?;
    std::fs::set_permissions(output, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", output.display()))
}
