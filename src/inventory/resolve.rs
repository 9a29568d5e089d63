//! `canonicalize` for many files in few directories.
//!
//! glibc's realpath reads every component of every path with readlink: the driver's ~60
//! files cost ~540 readlink calls per inventory, ~70 % of nvhook-runtime's system calls on a
//! container start. The driver's files live in a handful of directories, so each directory
//! is resolved (component by component, each once) and opened once, and each file costs
//! one lookup relative to it (fstatat), plus a readlinkat per symlink hop: the kernel no
//! longer walks the whole path each time.

use crate::file_id::FileId;
use nix::fcntl::{AtFlags, OFlag, readlinkat};
use nix::sys::stat::{Mode, SFlag, fstatat};
use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// The kernel's own limit on symlinks followed in one lookup.
const MAX_HOPS: usize = 40;

/// A directory, canonical, and opened (O_PATH) for lookups relative to it, with its identity
/// as it was opened: a search that read it saw it that way or later.
struct Dir {
    path: PathBuf,
    fd: OwnedFd,
    id: Option<FileId>,
}

/// Where a path ends: canonical, and whether it is a directory.
pub struct Found {
    pub path: PathBuf,
    pub is_dir: bool,
}

#[derive(Default)]
pub struct Resolver {
    dirs: RefCell<HashMap<PathBuf, Option<Rc<Dir>>>>,
    /// Whether each directory's identity is taken as it is opened, for [`Resolver::consulted`].
    recording: bool,
}

impl Resolver {
    pub fn new(recording: bool) -> Resolver {
        Resolver {
            recording,
            ..Resolver::default()
        }
    }

    /// What `std::fs::canonicalize(path)` returns, or None where it fails.
    pub fn canonical(&self, path: &Path) -> Option<PathBuf> {
        self.canonical_found(path).map(|found| found.path)
    }

    /// [`Resolver::canonical`], with whether the path ends at a directory: known from the lookup
    /// that found it, without another.
    pub fn canonical_found(&self, path: &Path) -> Option<Found> {
        let mut path = path.to_path_buf();
        for _ in 0..MAX_HOPS {
            let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                // `/`, or a path ending in `..`: nothing to share.
                let path = std::fs::canonicalize(&path).ok()?;
                let is_dir = path.is_dir();
                return Some(Found { path, is_dir });
            };
            let dir = self.dir(parent)?;
            let st = fstatat(&dir.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
            let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
            if kind != SFlag::S_IFLNK {
                return Some(Found {
                    path: dir.path.join(name),
                    is_dir: kind == SFlag::S_IFDIR,
                });
            }
            // A relative target resolves against the link's (already canonical) directory.
            let target = readlinkat(&dir.fd, name).ok()?;
            path = dir.path.join(target);
        }
        None
    }

    /// `dir`, canonical, where it is a directory: opened, so that it counts as looked into.
    pub fn directory(&self, dir: &Path) -> Option<PathBuf> {
        self.dir(dir).map(|d| d.path.clone())
    }

    /// Every directory looked into so far (canonical, each once), with its identity when it
    /// was opened (None where it could not be read, or the resolver does not record).
    pub fn consulted(&self) -> Vec<(PathBuf, Option<FileId>)> {
        let mut out: Vec<(PathBuf, Option<FileId>)> = self
            .dirs
            .borrow()
            .values()
            .flatten()
            .map(|d| (d.path.clone(), d.id.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.dedup_by(|a, b| a.0 == b.0);
        out
    }

    /// Makes `dir`, canonical already, where lookups below it start: the walk from `/` down to
    /// it is not made again, one component at a time, for the files under it.
    pub fn start_at(&self, dir: &Path) {
        let opened = self.open(dir.to_path_buf());
        self.dirs.borrow_mut().insert(dir.to_path_buf(), opened);
    }

    fn dir(&self, dir: &Path) -> Option<Rc<Dir>> {
        if let Some(known) = self.dirs.borrow().get(dir) {
            return known.clone();
        }
        // Resolved like a file, relative to its own parent: directories share prefixes.
        let opened = self.canonical(dir).and_then(|path| self.open(path));
        self.dirs
            .borrow_mut()
            .insert(dir.to_path_buf(), opened.clone());
        opened
    }

    /// The directory at `path`, which is canonical.
    fn open(&self, path: PathBuf) -> Option<Rc<Dir>> {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::open(&path, flags, Mode::empty()).ok()?;
        let id = self.recording.then(|| FileId::of_fd(fd.as_fd())).flatten();
        Some(Rc::new(Dir { path, fd, id }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn agrees_with_canonicalize() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let lib = root.join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(root.join("opt/nvidia")).unwrap();
        std::fs::write(lib.join("libcuda.so.580.1"), b"").unwrap();
        std::fs::write(root.join("opt/nvidia/libnvidia-ml.so.580.1"), b"").unwrap();
        // merged /usr: /lib -> usr/lib
        symlink("usr/lib", root.join("lib")).unwrap();
        symlink("libcuda.so.580.1", lib.join("libcuda.so.1")).unwrap();
        symlink("libcuda.so.1", lib.join("libcuda.so")).unwrap();
        symlink(
            root.join("opt/nvidia/libnvidia-ml.so.580.1"),
            lib.join("libnvidia-ml.so.1"),
        )
        .unwrap();
        symlink(
            "../../../opt/nvidia/libnvidia-ml.so.580.1",
            lib.join("rel-ml"),
        )
        .unwrap();
        symlink("missing", lib.join("dangling")).unwrap();
        symlink("loop-b", lib.join("loop-a")).unwrap();
        symlink("loop-a", lib.join("loop-b")).unwrap();
        let resolver = Resolver::default();
        // One that starts at the root, as a driver root's does, agrees as well.
        let from_root = Resolver::default();
        from_root.start_at(&std::fs::canonicalize(root).unwrap());
        for rel in [
            "lib/x86_64-linux-gnu/libcuda.so",
            "lib/x86_64-linux-gnu/libcuda.so.1",
            "usr/lib/x86_64-linux-gnu/libcuda.so.580.1",
            "lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            "usr/lib/x86_64-linux-gnu/rel-ml",
            "usr/lib/x86_64-linux-gnu/dangling",
            "usr/lib/x86_64-linux-gnu/loop-a",
            "usr/lib/x86_64-linux-gnu/absent",
            "usr/lib/x86_64-linux-gnu/../x86_64-linux-gnu/libcuda.so.1",
            "usr/lib",
            "lib",
        ] {
            let path = root.join(rel);
            let expected = std::fs::canonicalize(&path).ok();
            assert_eq!(resolver.canonical(&path), expected, "{rel}");
            assert_eq!(
                resolver.canonical_found(&path).map(|f| f.is_dir),
                expected.as_ref().map(|p| p.is_dir()),
                "{rel}: a directory or not"
            );
            // The tempdir's own path may lead through links (/tmp): from the canonical root.
            let under_root = std::fs::canonicalize(root).unwrap().join(rel);
            assert_eq!(
                from_root.canonical(&under_root),
                expected,
                "{rel}, from the root"
            );
        }
    }
}
