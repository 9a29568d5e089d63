//! The architecture an ELF file is built for (its header's class, byte order and `e_machine`)
//! and the one the kernel runs (issue 29, mixed fleets): how `nvhook doctor` finds an nvhook
//! binary or a driver library of another architecture (an x86_64 nvhook-nvml copied onto a
//! Grace node would fail only when a GPU container starts), and how `nvhook info` names the
//! architecture of the driver it found.

use crate::inventory::Inventory;
use nvhook_ldcache::{Arch, ElfClass};
use nvhook_model::inventory::wsl;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The bytes of an ELF header up to and including `e_machine`.
pub const HEAD_LEN: usize = 20;

/// What the first [`HEAD_LEN`] bytes of an ELF file say about its architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElfHead {
    /// `EI_CLASS`: 1 for 32-bit, 2 for 64-bit files.
    pub class: u8,
    /// `e_machine`, read in the file's own byte order (`EI_DATA`).
    pub machine: u16,
}

impl ElfHead {
    /// The header at the start of `head`, or why there is none.
    pub fn parse(head: &[u8]) -> Result<ElfHead, String> {
        if head.len() < 4 || head[..4] != *b"\x7fELF" {
            return Err("not an ELF file".into());
        }
        if head.len() < HEAD_LEN {
            return Err(format!(
                "a truncated ELF header ({} of {HEAD_LEN} bytes)",
                head.len()
            ));
        }
        let bytes = [head[18], head[19]];
        let machine = match head[5] {
            1 => u16::from_le_bytes(bytes),
            2 => u16::from_be_bytes(bytes),
            other => return Err(format!("an ELF file of unknown byte order {other}")),
        };
        Ok(ElfHead {
            class: head[4],
            machine,
        })
    }

    /// The architecture and class of nvhook's that the header names; None for another
    /// machine, or a class that contradicts the machine.
    pub fn arch(self) -> Option<(Arch, ElfClass)> {
        let (arch, class) = Arch::of_elf_machine(self.machine)?;
        let ei_class = match class {
            ElfClass::Lib64 => 2,
            ElfClass::Lib32 => 1,
        };
        (self.class == ei_class).then_some((arch, class))
    }

    /// The name `uname -m` or Debian gives the machine: `x86_64`, `i386`, `aarch64`, `arm`,
    /// else `ELF machine N`.
    pub fn name(self) -> String {
        match Arch::of_elf_machine(self.machine) {
            Some((arch, ElfClass::Lib64)) => arch.name().to_owned(),
            Some((Arch::X86_64, ElfClass::Lib32)) => "i386".to_owned(),
            Some((Arch::Aarch64, ElfClass::Lib32)) => "arm".to_owned(),
            None => format!("ELF machine {}", self.machine),
        }
    }
}

/// The first [`HEAD_LEN`] bytes of `path` (fewer when the file is shorter).
pub fn read_head(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(HEAD_LEN);
    std::fs::File::open(path)?
        .take(HEAD_LEN as u64)
        .read_to_end(&mut head)?;
    Ok(head)
}

/// The machine the kernel runs (`uname -m`). Not the build target's: an nvhook of another
/// architecture may be running under binfmt_misc's qemu.
pub fn kernel_machine() -> String {
    // SAFETY: a zeroed `utsname` is a valid value of a plain C struct.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname fills the struct it is given; its fields are NUL-terminated.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return String::new();
    }
    // SAFETY: the kernel NUL-terminates `machine` within the array.
    unsafe { std::ffi::CStr::from_ptr(uts.machine.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Where a 64-bit file of `arch` fails to be one: None when it is; else what it is instead
/// (`built for x86_64`, `not an ELF file`).
pub fn mismatch(head: &[u8], arch: Arch) -> Option<String> {
    match ElfHead::parse(head) {
        Err(why) => Some(why),
        Ok(elf) if elf.arch() == Some((arch, ElfClass::Lib64)) => None,
        Ok(elf) => Some(format!("built for {}", elf.name())),
    }
}

/// The driver's NVML library and the architecture its ELF header names: what `nvhook info`
/// reports as the driver's architecture.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DriverArch {
    /// `x86_64`, `aarch64`, ... (see [`ElfHead::name`]); None where the file says none.
    pub machine: Option<String>,
    /// Why the file names no machine (unreadable, not ELF).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub library: PathBuf,
}

/// The architecture of the 64-bit `libnvidia-ml.so.1` (else `libcuda.so.1`) the inventory
/// found; None when it found neither.
pub fn driver_arch(inv: &Inventory) -> Option<DriverArch> {
    let library = match &inv.wsl {
        Some(driver) => &driver.store_file(wsl::NVML)?.host_path,
        None => {
            &["libnvidia-ml.so.1", "libcuda.so.1"]
                .iter()
                .find_map(|soname| {
                    inv.files
                        .libraries
                        .iter()
                        .find(|l| l.soname == *soname && l.class == ElfClass::Lib64)
                })?
                .host_path
        }
    };
    let machine = read_head(library)
        .map_err(|e| e.to_string())
        .and_then(|head| ElfHead::parse(&head))
        .map(ElfHead::name);
    Some(DriverArch {
        machine: machine.as_ref().ok().cloned(),
        error: machine.err(),
        library: library.clone(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The first bytes of an ELF file of `class` and `machine`, little-endian.
    pub(crate) fn elf_head(class: u8, machine: u16) -> Vec<u8> {
        let mut head = vec![0u8; 64];
        head[..4].copy_from_slice(b"\x7fELF");
        head[4] = class;
        head[5] = 1;
        head[6] = 1;
        head[16] = 3; // ET_DYN
        head[18..20].copy_from_slice(&machine.to_le_bytes());
        head
    }

    #[test]
    fn the_header_names_the_machine_in_its_own_byte_order() {
        let x86 = ElfHead::parse(&elf_head(2, 62)).unwrap();
        assert_eq!(x86.arch(), Some((Arch::X86_64, ElfClass::Lib64)));
        assert_eq!(x86.name(), "x86_64");
        let arm64 = ElfHead::parse(&elf_head(2, 183)).unwrap();
        assert_eq!(arm64.arch(), Some((Arch::Aarch64, ElfClass::Lib64)));
        assert_eq!(arm64.name(), "aarch64");
        assert_eq!(ElfHead::parse(&elf_head(1, 3)).unwrap().name(), "i386");
        assert_eq!(ElfHead::parse(&elf_head(1, 40)).unwrap().name(), "arm");
        // ppc64 big-endian: EI_DATA 2, e_machine 21 stored high byte first.
        let mut ppc = elf_head(2, 0);
        ppc[5] = 2;
        ppc[18..20].copy_from_slice(&21u16.to_be_bytes());
        let ppc = ElfHead::parse(&ppc).unwrap();
        assert_eq!((ppc.machine, ppc.arch()), (21, None));
        assert_eq!(ppc.name(), "ELF machine 21");
        // A 32-bit class with a 64-bit machine is no file of nvhook's architectures.
        assert_eq!(ElfHead::parse(&elf_head(1, 183)).unwrap().arch(), None);
    }

    #[test]
    fn short_or_foreign_files_say_why() {
        assert_eq!(
            ElfHead::parse(b"#!/bin/sh\n"),
            Err("not an ELF file".into())
        );
        assert_eq!(ElfHead::parse(b""), Err("not an ELF file".into()));
        let short = ElfHead::parse(&elf_head(2, 62)[..5]).unwrap_err();
        assert!(short.contains("truncated"), "{short}");
        let mut odd = elf_head(2, 62);
        odd[5] = 7;
        assert!(ElfHead::parse(&odd).unwrap_err().contains("byte order"));
    }

    #[test]
    fn a_file_of_another_architecture_is_named() {
        assert_eq!(mismatch(&elf_head(2, 183), Arch::Aarch64), None);
        assert_eq!(
            mismatch(&elf_head(2, 62), Arch::Aarch64).as_deref(),
            Some("built for x86_64")
        );
        assert_eq!(
            mismatch(&elf_head(2, 183), Arch::X86_64).as_deref(),
            Some("built for aarch64")
        );
        assert_eq!(
            mismatch(&elf_head(1, 3), Arch::X86_64).as_deref(),
            Some("built for i386")
        );
        assert_eq!(
            mismatch(b"text", Arch::X86_64).as_deref(),
            Some("not an ELF file")
        );
    }

    #[test]
    fn read_head_reads_at_most_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lib.so");
        std::fs::write(&file, elf_head(2, 183)).unwrap();
        assert_eq!(read_head(&file).unwrap(), elf_head(2, 183)[..HEAD_LEN]);
        std::fs::write(&file, b"\x7fEL").unwrap();
        assert_eq!(read_head(&file).unwrap(), b"\x7fEL");
        assert!(read_head(&dir.path().join("none")).is_err());
    }

    #[test]
    fn the_driver_arch_is_its_nvml_library_s() {
        let dir = tempfile::tempdir().unwrap();
        let mut inv = nvhook_model::plan::fixtures::standard();
        assert_eq!(
            driver_arch(&inv).map(|d| d.machine),
            Some(None),
            "no such files"
        );
        let nvml = inv
            .files
            .libraries
            .iter_mut()
            .find(|l| l.soname == "libnvidia-ml.so.1" && l.class == ElfClass::Lib64)
            .unwrap();
        nvml.host_path = dir.path().join("libnvidia-ml.so.1");
        std::fs::write(&nvml.host_path, elf_head(2, 183)).unwrap();
        let found = driver_arch(&inv).unwrap();
        assert_eq!(found.machine.as_deref(), Some("aarch64"));
        assert_eq!(found.library, dir.path().join("libnvidia-ml.so.1"));
        assert_eq!(found.error, None);
        std::fs::write(&found.library, b"text").unwrap();
        let damaged = driver_arch(&inv).unwrap();
        assert_eq!(
            (damaged.machine, damaged.error.as_deref()),
            (None, Some("not an ELF file"))
        );
        // Without NVML's library, libcuda's.
        inv.files
            .libraries
            .retain(|l| l.soname != "libnvidia-ml.so.1");
        let cuda = driver_arch(&inv).unwrap();
        assert!(
            cuda.library.to_string_lossy().contains("libcuda"),
            "{cuda:?}"
        );
        inv.files.libraries.clear();
        assert_eq!(driver_arch(&inv), None);
    }

    #[test]
    fn the_kernel_names_a_machine() {
        let machine = kernel_machine();
        // This test runs natively or under qemu-user, which reports the emulated machine.
        assert_eq!(Arch::from_name(&machine), Some(Arch::HOST), "{machine}");
    }
}
