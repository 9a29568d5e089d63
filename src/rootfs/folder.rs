//! The shared libraries in a directory of the container, read-only: what NVIDIA's
//! `update-ldcache --folder DIR` hands to ldconfig, which nvhook never runs. Each regular
//! `*.so*` file in the directory is opened inside the rootfs (pathrs; a link in the directory is
//! never followed) and only its ELF header, program headers and dynamic section are read, for
//! its class and SONAME.

use super::elf::{Elf, u16_at, u32_at, u64_at};
use super::{Rootfs, sys};
use nvhook_ldcache::ElfClass;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

/// More files than a library directory of an image holds.
const MAX_ENTRIES: usize = 8192;
/// Program headers and dynamic entries looked at, at most.
const MAX_HEADERS: usize = 128;
const MAX_DYNAMIC: usize = 1024;
const MAX_SONAME: usize = 256;

/// A shared library found in a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// Its file name in the directory.
    pub file: String,
    pub soname: String,
    pub class: ElfClass,
}

impl Rootfs {
    /// The shared libraries (regular ELF files with a SONAME) in the container's `dir`, sorted
    /// by file name; none when the directory is absent.
    pub fn libraries_in(&self, dir: &str) -> Vec<Library> {
        let Ok(handle) = self.dir_if_exists(dir) else {
            tracing::info!(
                dir,
                "no such directory in the container: no libraries from it"
            );
            return Vec::new();
        };
        let names = match sys::dir_names(handle.as_fd(), MAX_ENTRIES) {
            Ok(names) => names,
            Err(e) => {
                tracing::warn!(dir, error = %e, "library directory not read");
                return Vec::new();
            }
        };
        let mut out: Vec<Library> = names
            .iter()
            .filter_map(|name| name.to_str().ok())
            .filter(|name| name.contains(".so"))
            .filter_map(|name| {
                let path = format!("{}/{name}", dir.trim_end_matches('/'));
                let (file, _) = self.open_regular(&path).ok()??;
                let (class, soname) =
                    elf_soname(&|offset, buf| file.read_exact_at(buf, offset).is_ok())?;
                Some(Library {
                    file: name.to_string(),
                    soname,
                    class,
                })
            })
            .collect();
        out.sort_by(|a, b| a.file.cmp(&b.file));
        out
    }

    /// The links for ld(1) in the container's `dir` (`libcuda.so`: a name ending in `.so`)
    /// that lead to one of `libraries` (found there, by file name or SONAME), with its class.
    pub fn dev_links_in(&self, dir: &str, libraries: &[Library]) -> Vec<(String, ElfClass)> {
        let Ok(handle) = self.dir_if_exists(dir) else {
            return Vec::new();
        };
        let Ok(names) = sys::dir_names(handle.as_fd(), MAX_ENTRIES) else {
            return Vec::new();
        };
        let mut out: Vec<(String, ElfClass)> = names
            .iter()
            .filter(|name| name.to_bytes().ends_with(b".so"))
            .filter_map(|name| {
                let st = sys::lstat_at(handle.as_fd(), name).ok()??;
                if sys::file_type(&st) != libc::S_IFLNK {
                    return None;
                }
                let target = sys::readlink_at(handle.as_fd(), name).ok()?;
                let target = std::str::from_utf8(&target).ok()?;
                let lib = libraries
                    .iter()
                    .find(|l| l.file == target || l.soname == target)?;
                Some((name.to_str().ok()?.to_string(), lib.class))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// The class and SONAME of a little-endian ELF shared object, read through `read_at` (fills
/// the buffer from the offset, or returns false); None for anything else.
pub fn elf_soname(read_at: &dyn Fn(u64, &mut [u8]) -> bool) -> Option<(ElfClass, String)> {
    let elf = Elf::read(read_at)?;
    let (ident, wide) = (elf.head, elf.wide);
    let word = |b: &[u8], o: usize| elf.word(b, o);
    let (phoff, phentsize, phnum) = if wide {
        (
            u64_at(&ident, 0x20)?,
            u16_at(&ident, 0x36)?,
            u16_at(&ident, 0x38)?,
        )
    } else {
        (
            u64::from(u32_at(&ident, 0x1c)?),
            u16_at(&ident, 0x2a)?,
            u16_at(&ident, 0x2c)?,
        )
    };
    let (phentsize, phnum) = (usize::from(phentsize), usize::from(phnum));
    if phnum > MAX_HEADERS || phentsize < if wide { 56 } else { 32 } {
        return None;
    }
    let mut headers = vec![0u8; phentsize * phnum];
    if !read_at(phoff, &mut headers) {
        return None;
    }
    // (offset, vaddr, filesz) of each PT_LOAD, and the PT_DYNAMIC's.
    let segment = |h: &[u8]| {
        Some(if wide {
            (word(h, 8)?, word(h, 16)?, word(h, 32)?)
        } else {
            (word(h, 4)?, word(h, 8)?, word(h, 16)?)
        })
    };
    let mut loads = Vec::new();
    let mut dynamic = None;
    for h in headers.chunks(phentsize) {
        match u32_at(h, 0)? {
            1 => loads.push(segment(h)?),
            2 => dynamic = Some(segment(h)?),
            _ => {}
        }
    }
    let (dyn_offset, _, dyn_size) = dynamic?;
    let entry = if wide { 16 } else { 8 };
    let count = usize::try_from(dyn_size).ok()? / entry;
    let mut entries = vec![0u8; count.min(MAX_DYNAMIC) * entry];
    if !read_at(dyn_offset, &mut entries) {
        return None;
    }
    let (mut strtab, mut soname) = (None, None);
    for e in entries.chunks(entry) {
        let (tag, value) = (word(e, 0)?, word(e, entry / 2)?);
        match tag {
            0 => break,
            5 => strtab = Some(value),
            14 => soname = Some(value),
            _ => {}
        }
    }
    let (strtab, soname) = (strtab?, soname?);
    // The string table's address, as a file offset.
    let (offset, vaddr, _) = loads
        .iter()
        .find(|(_, vaddr, size)| *vaddr <= strtab && strtab - vaddr < *size)?;
    let at = strtab
        .checked_sub(*vaddr)?
        .checked_add(*offset)?
        .checked_add(soname)?;
    let mut name = vec![0u8; MAX_SONAME];
    // Near the end of the file the full buffer does not fit: read what there is.
    let mut len = MAX_SONAME;
    while len > 0 && !read_at(at, &mut name[..len]) {
        len /= 2;
    }
    let end = name[..len].iter().position(|&b| b == 0)?;
    let text = std::str::from_utf8(&name[..end]).ok()?;
    if text.is_empty() || text.contains('/') {
        return None;
    }
    let class = if wide {
        ElfClass::Lib64
    } else {
        ElfClass::Lib32
    };
    Some((class, text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn soname_of(path: &std::path::Path) -> Option<(ElfClass, String)> {
        let file = fs::File::open(path).ok()?;
        elf_soname(&|offset, buf| file.read_exact_at(buf, offset).is_ok())
    }

    #[test]
    fn the_hosts_libc_has_its_soname() {
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("a libc.so.6");
        assert_eq!(
            soname_of(std::path::Path::new(libc)),
            Some((ElfClass::Lib64, "libc.so.6".to_string()))
        );
    }

    #[test]
    fn non_libraries_have_none() {
        let tmp = tempfile::tempdir().unwrap();
        for (name, bytes) in [
            ("empty", &b""[..]),
            ("text", b"#!/bin/sh\necho hi\n"),
            ("header only", b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0"),
            ("big endian", b"\x7fELF\x02\x02\x01\0\0\0\0\0\0\0\0\0"),
        ] {
            let path = tmp.path().join(name);
            fs::write(&path, bytes).unwrap();
            assert_eq!(soname_of(&path), None, "{name}");
        }
        // A program has no SONAME.
        assert_eq!(soname_of(std::path::Path::new("/bin/sh")), None);
    }

    #[test]
    fn libraries_in_a_directory_are_regular_files_only() {
        let tmp = tempfile::tempdir().unwrap();
        let lib = tmp.path().join("usr/lib");
        fs::create_dir_all(&lib).unwrap();
        let libc = fs::canonicalize("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        fs::copy(&libc, lib.join("libc-copy.so.6.0")).unwrap();
        std::os::unix::fs::symlink(&libc, lib.join("liblink.so.1")).unwrap();
        fs::write(lib.join("libjunk.so.1"), b"junk").unwrap();
        let rootfs = Rootfs::open(tmp.path()).unwrap();
        assert_eq!(
            rootfs.libraries_in("/usr/lib"),
            vec![Library {
                file: "libc-copy.so.6.0".into(),
                soname: "libc.so.6".into(),
                class: ElfClass::Lib64,
            }]
        );
        assert!(rootfs.libraries_in("/nowhere").is_empty());
    }
}
