//! Safe operations inside a container rootfs that somebody else built.
//!
//! Directories are opened one component at a time, O_NOFOLLOW, relative to their parent's
//! descriptor, and any link on the way is resolved by pathrs (RESOLVE_IN_ROOT semantics:
//! absolute symlinks stay inside the rootfs); the last component is then handled with *at
//! calls on that directory descriptor with O_NOFOLLOW / O_EXCL, so no path string is ever
//! resolved twice.

mod boundary;
pub mod compat;
mod elf;
pub mod elf_note;
pub mod folder;
pub mod loader;
pub mod sys;

use crate::plan::{ImageInfo, MountKind};
use crate::shown::{Shown, ShownPath};
use pathrs::Root;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::rc::Rc;

#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("cannot open the container rootfs {path}: {message}")]
    Open { path: String, message: String },
    /// root.path names the host's own root (`/`, or a bind of it): every write would land on
    /// the host, as NVIDIA's hooks once did with such a bundle.
    #[error(
        "the container rootfs {path} is the host's own root directory: nvhook writes nothing there (root.path in config.json must name the container's rootfs)"
    )]
    HostRoot { path: String },
    #[error("cannot {op} {path} in the container: {message}")]
    Op {
        op: &'static str,
        path: String,
        message: String,
    },
    #[error(
        "cannot write {path} in the container: {why}: nvhook will not write into a volume ({fix})"
    )]
    Volume {
        path: String,
        why: String,
        fix: &'static str,
    },
}

pub(crate) fn op_err(op: &'static str, path: &str, e: impl std::fmt::Display) -> RootfsError {
    RootfsError::Op {
        op,
        path: path.to_string(),
        message: e.to_string(),
    }
}

/// Flags that create a file that was not there, never following a link (open_at adds
/// O_NOFOLLOW).
pub(crate) const NEW_FILE: i32 = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY;

/// What is at a target path before nvhook writes there, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    Created,
    /// The image already had a file there, now covered or replaced.
    Replaced,
    /// Already exactly as wanted (e.g. a node the runtime made).
    Kept,
}

pub struct Rootfs {
    root: Root,
    /// Each directory is resolved (and created) once: a pathrs resolution costs far more than
    /// the *at calls made relative to its result, and a plan touches a handful of directories.
    dirs: RefCell<HashMap<String, Rc<pathrs::Handle>>>,
    /// The directories of `dirs` checked to be on a mount nvhook may write on.
    writable: RefCell<HashMap<String, Rc<pathrs::Handle>>>,
    boundary: boundary::Boundary,
}

/// Why the rootfs at `path` cannot be opened, naming the mistake as runc would (pathrs says
/// only "open root handle failed"); pathrs's error and its causes where the path looks right.
fn unusable_root(path: &Path, error: &dyn std::error::Error) -> String {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            "no such directory (check root.path in config.json)".into()
        }
        Ok(meta) if meta.file_type().is_symlink() => {
            "it is a symlink, which runtimes refuse as a rootfs (runc: \"not an absolute path, or a symlink\"): point root.path at the directory itself".into()
        }
        Ok(meta) if !meta.is_dir() => "not a directory (check root.path in config.json)".into(),
        _ => {
            let mut message = error.to_string();
            let mut cause = error.source();
            while let Some(e) = cause {
                message = format!("{message}: {e}");
                cause = e.source();
            }
            message
        }
    }
}

/// Whether `st` is the directory `host` (this mount namespace's `/`), by device and inode.
fn is_host_root(st: &libc::stat, host: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    st.st_dev == host.dev() && st.st_ino == host.ino()
}

/// Splits an absolute container path into its directory and last component.
fn split(path: &str) -> Result<(&str, CString), RootfsError> {
    let (dir, name) = path
        .rsplit_once('/')
        .filter(|(_, n)| !n.is_empty() && *n != "." && *n != "..")
        .ok_or_else(|| op_err("use", path, "not an absolute file path"))?;
    let name = CString::new(name).map_err(|e| op_err("use", path, e))?;
    Ok((if dir.is_empty() { "/" } else { dir }, name))
}

/// The components of an absolute directory path; `.` and `..` are refused.
fn components(dir: &str) -> Result<Vec<&str>, &'static str> {
    let parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    if parts.iter().any(|p| *p == "." || *p == "..") {
        return Err("the path has . or .. components");
    }
    Ok(parts)
}

/// The cache key of a directory: its components joined under `/`.
fn key(parts: &[&str]) -> String {
    format!("/{}", parts.join("/"))
}

impl Rootfs {
    /// The rootfs at `path`, where nvhook writes only on the rootfs's own mount until
    /// [`Rootfs::with_mounts`] adds the runtime's.
    pub fn open(path: &Path) -> Result<Rootfs, RootfsError> {
        let open_err = |message: String| RootfsError::Open {
            path: ShownPath(path).to_string(),
            message,
        };
        let root = Root::open(path).map_err(|e| open_err(unusable_root(path, &e)))?;
        let st = sys::fstat(root.as_fd()).map_err(|e| open_err(e.to_string()))?;
        let host = std::fs::metadata("/").map_err(|e| open_err(format!("stat /: {e}")))?;
        if is_host_root(&st, &host) {
            return Err(RootfsError::HostRoot {
                path: ShownPath(path).to_string(),
            });
        }
        let boundary =
            boundary::Boundary::new(root.as_fd()).map_err(|e| open_err(e.to_string()))?;
        Ok(Rootfs {
            root,
            dirs: RefCell::default(),
            writable: RefCell::default(),
            boundary,
        })
    }

    /// The directory `dir` for writing `path` in it, created (0755) where missing.
    fn dir(&self, path: &str, dir: &str) -> Result<Rc<pathrs::Handle>, RootfsError> {
        self.dir_with(path, dir, 0o755)
    }

    fn dir_with(
        &self,
        path: &str,
        dir: &str,
        mode: u32,
    ) -> Result<Rc<pathrs::Handle>, RootfsError> {
        if let Some(h) = self.writable.borrow().get(dir) {
            return Ok(Rc::clone(h));
        }
        let handle = match self.open_or_create_dir(path, dir, mode) {
            Ok(handle) => handle,
            Err(e @ RootfsError::Volume { .. }) => return Err(e),
            Err(e) => {
                return Err(match self.blocker(dir) {
                    Some(why) => op_err("create directory", dir, format!("{why}; fix the image")),
                    None => e,
                });
            }
        };
        self.writable
            .borrow_mut()
            .insert(dir.to_string(), Rc::clone(&handle));
        Ok(handle)
    }

    /// Why `dir` cannot be made in the image, in the image's terms: the first component that
    /// is a link leading nowhere inside it (dangling, a loop, or out of the rootfs), or that
    /// is not a directory. None when every existing component is a directory.
    // Out of line: pathrs's readlink keeps a 128 KiB buffer on the stack, and inlined into
    // `dir` that frame (32 pages to fault in) was paid on every start, not just on errors.
    #[cold]
    #[inline(never)]
    fn blocker(&self, dir: &str) -> Option<String> {
        let mut prefix = String::new();
        for part in dir.split('/').filter(|p| !p.is_empty()) {
            prefix.push('/');
            prefix.push_str(part);
            match self.root.resolve(&prefix) {
                Ok(h) => {
                    let st = sys::fstat(h.as_fd()).ok()?;
                    if sys::file_type(&st) != libc::S_IFDIR {
                        return Some(format!("the image's {prefix} is not a directory"));
                    }
                }
                Err(_) => {
                    let target = self.root.readlink(&prefix).ok()?;
                    return Some(format!(
                        "the image's {prefix} is a link to {} that leads nowhere inside the image",
                        Shown(target.to_string_lossy())
                    ));
                }
            }
        }
        None
    }

    /// Mirrors pathrs's mkdir_all (component by component, no `..`) without its procfs
    /// re-open of every directory it makes.
    /// The deepest existing directory must be on a mount nvhook writes on, before anything is
    /// created under it.
    /// The directory `dir`, its missing components created with `mode` (on mounts nvhook may
    /// write on, as every write); later writes in it find it made.
    pub fn create_dirs(&self, dir: &str, mode: u32) -> Result<(), RootfsError> {
        self.dir_with(dir, dir, mode).map(drop)
    }

    fn open_or_create_dir(
        &self,
        path: &str,
        dir: &str,
        mode: u32,
    ) -> Result<Rc<pathrs::Handle>, RootfsError> {
        let fail = |e: &dyn std::fmt::Display| op_err("create directory", dir, e);
        let parts = components(dir).map_err(|e| fail(&e))?;
        let (mut current, depth) = self.walk(&parts).map_err(|e| fail(&e))?;
        if !self.allows(current.as_fd()) {
            return Err(self.volume_error(path, dir));
        }
        for (i, part) in parts.iter().enumerate().skip(depth) {
            let name = CString::new(*part).map_err(|e| fail(&e))?;
            match sys::mkdir_at(current.as_fd(), &name, mode) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(fail(&e)),
                _ => {}
            }
            // Only a directory, never a link that raced in: open_at adds O_NOFOLLOW.
            let fd = sys::open_at(current.as_fd(), &name, libc::O_PATH | libc::O_DIRECTORY, 0)
                .map_err(|e| fail(&e))?;
            current = self.remember(&parts[..=i], pathrs::Handle::from_fd(fd));
        }
        Ok(current)
    }

    /// The deepest directory of `parts` that exists, and how many components it covers.
    /// From the deepest one already known, each plain directory is opened with
    /// openat(O_PATH | O_NOFOLLOW | O_DIRECTORY) relative to its parent; a link (or anything
    /// else but a directory) is left to pathrs, which resolves that prefix inside the rootfs.
    /// A missing component ends the walk: an image lacking a directory costs one openat, not
    /// the report pathrs builds for every failed resolution (9 system calls reading /proc).
    fn walk(&self, parts: &[&str]) -> Result<(Rc<pathrs::Handle>, usize), String> {
        let known = (0..=parts.len()).rev().find_map(|d| {
            self.dirs
                .borrow()
                .get(&key(&parts[..d]))
                .map(|h| (Rc::clone(h), d))
        });
        let (mut current, mut depth) = match known {
            Some(found) => found,
            None => (
                self.remember(&[], self.root.resolve("/").map_err(|e| e.to_string())?),
                0,
            ),
        };
        while let Some(part) = parts.get(depth) {
            let name = CString::new(*part).map_err(|e| e.to_string())?;
            let next =
                match sys::open_at(current.as_fd(), &name, libc::O_PATH | libc::O_DIRECTORY, 0) {
                    Ok(fd) => pathrs::Handle::from_fd(fd),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) => {
                        let handle = self
                            .root
                            .resolve(key(&parts[..=depth]))
                            .map_err(|e| e.to_string())?;
                        let st = sys::fstat(handle.as_fd()).map_err(|e| e.to_string())?;
                        if sys::file_type(&st) != libc::S_IFDIR {
                            return Err("not a directory".into());
                        }
                        handle
                    }
                };
            depth += 1;
            current = self.remember(&parts[..depth], next);
        }
        Ok((current, depth))
    }

    /// Keeps a directory's handle for later lookups under it.
    fn remember(&self, parts: &[&str], handle: pathrs::Handle) -> Rc<pathrs::Handle> {
        let handle = Rc::new(handle);
        self.dirs
            .borrow_mut()
            .insert(key(parts), Rc::clone(&handle));
        handle
    }

    /// Whether `path` exists (a link at its end is followed, inside the rootfs).
    fn exists(&self, path: &str) -> bool {
        let Ok((dir, name)) = split(path) else {
            return false;
        };
        let Ok(dir) = self.dir_if_exists(dir) else {
            return false;
        };
        match sys::lstat_at(dir.as_fd(), &name) {
            Ok(Some(st)) if sys::file_type(&st) == libc::S_IFLNK => self.root.resolve(path).is_ok(),
            Ok(found) => found.is_some(),
            Err(_) => false,
        }
    }

    /// The highest of the directory `dir` and its ancestors the image lacks; None where the
    /// image has `dir`, or where a component is not a directory or a link leads nowhere.
    pub fn missing_from(&self, dir: &str) -> Option<String> {
        let parts = components(dir).ok()?;
        let (_, depth) = self.walk(&parts).ok()?;
        (depth < parts.len()).then(|| key(&parts[..=depth]))
    }

    fn is_dir(&self, path: &str) -> bool {
        self.dir_if_exists(path).is_ok()
    }

    /// Reads only; safe to call on a rootfs from the host's mount namespace.
    pub fn probe(&self) -> ImageInfo {
        ImageInfo {
            debian: self.exists("/etc/debian_version"),
            has_usr_lib64: self.is_dir("/usr/lib64"),
            has_ldcache: self.exists("/etc/ld.so.cache"),
            cuda_compat: None,
        }
    }

    /// An O_PATH descriptor of a mount point for `kind` at `path`, created with O_EXCL when
    /// missing. A file the image has there is kept as the mount point (the host's file covers
    /// it); a symlink is replaced, never followed.
    pub fn mount_target(
        &self,
        path: &str,
        kind: MountKind,
    ) -> Result<(OwnedFd, Existing), RootfsError> {
        let (dir, name) = split(path)?;
        let dir = self.dir(path, dir)?;
        let dirfd = dir.as_fd();
        let want_dir = kind == MountKind::Dir;
        if !want_dir {
            // The usual case, nothing there: a file made with O_CREAT|O_EXCL|O_NOFOLLOW is a
            // new inode of our own, so its descriptor is the mount point as it stands.
            match sys::open_at(dirfd, &name, NEW_FILE, 0o644) {
                Ok(fd) => return Ok((fd, Existing::Created)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(op_err("create mount point", path, e)),
            }
        }
        let existing = match sys::lstat_at(dirfd, &name).map_err(|e| op_err("inspect", path, e))? {
            None => Existing::Created,
            Some(st) if sys::file_type(&st) == libc::S_IFLNK => {
                sys::unlink_at(dirfd, &name).map_err(|e| op_err("remove symlink", path, e))?;
                Existing::Created
            }
            Some(st) => {
                let is_dir = sys::file_type(&st) == libc::S_IFDIR;
                if is_dir != want_dir {
                    return Err(op_err(
                        "mount over",
                        path,
                        if is_dir {
                            "the image has a directory where a file is expected"
                        } else {
                            "the image has a file where a directory is expected"
                        },
                    ));
                }
                Existing::Replaced
            }
        };
        if existing == Existing::Created {
            let created = if want_dir {
                sys::mkdir_at(dirfd, &name, 0o755)
            } else {
                sys::open_at(dirfd, &name, NEW_FILE, 0o644).map(drop)
            };
            created.map_err(|e| op_err("create mount point", path, e))?;
        }
        let target = sys::open_at(dirfd, &name, libc::O_PATH, 0)
            .map_err(|e| op_err("open mount point", path, e))?;
        // Whatever raced in between must still be the kind of inode we expect.
        let st = sys::fstat(target.as_fd()).map_err(|e| op_err("inspect", path, e))?;
        let ok = match kind {
            MountKind::Dir => sys::file_type(&st) == libc::S_IFDIR,
            MountKind::File | MountKind::Socket => sys::file_type(&st) == libc::S_IFREG,
        };
        if !ok {
            return Err(op_err("mount over", path, "the mount point changed type"));
        }
        Ok((target, existing))
    }

    /// A character device node; an existing node with the same numbers is left alone.
    pub fn make_node(
        &self,
        path: &str,
        major: u32,
        minor: u32,
        mode: u32,
    ) -> Result<Existing, RootfsError> {
        let (dir_path, name) = split(path)?;
        let same = |dir: &pathrs::Handle| -> Result<bool, RootfsError> {
            let st = sys::lstat_at(dir.as_fd(), &name).map_err(|e| op_err("inspect", path, e))?;
            Ok(st.is_some_and(|st| {
                sys::file_type(&st) == libc::S_IFCHR
                    && libc::major(st.st_rdev) == major
                    && libc::minor(st.st_rdev) == minor
            }))
        };
        let dir = match self.dir(path, dir_path) {
            Ok(dir) => dir,
            // A /dev bound from the host (a privileged pod's) already has the node: nothing
            // to write, so nothing to refuse.
            Err(e @ RootfsError::Volume { .. }) => {
                return match self.dir_if_exists(dir_path) {
                    Ok(dir) if same(&dir)? => Ok(Existing::Kept),
                    _ => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        match sys::mknod_at(dir.as_fd(), &name, mode, major, minor) {
            Ok(()) => Ok(Existing::Created),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if same(&dir)? {
                    Ok(Existing::Kept)
                } else {
                    Err(op_err(
                        "create device node",
                        path,
                        format!("something else than char device {major}:{minor} is already there"),
                    ))
                }
            }
            Err(e) => Err(op_err("create device node", path, e)),
        }
    }

    /// A symlink `path -> target`; an image's own file or link there is replaced.
    pub fn make_symlink(&self, path: &str, target: &str) -> Result<Existing, RootfsError> {
        let (dir, name) = split(path)?;
        let dir = self.dir(path, dir)?;
        let dirfd = dir.as_fd();
        let target_c = CString::new(target).map_err(|e| op_err("link", path, e))?;
        // symlinkat never follows what is already there: try the usual case first.
        match sys::symlink_at(&target_c, dirfd, &name) {
            Ok(()) => return Ok(Existing::Created),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(op_err("create symlink", path, e)),
        }
        let mut existing = Existing::Created;
        if let Some(st) = sys::lstat_at(dirfd, &name).map_err(|e| op_err("inspect", path, e))? {
            match sys::file_type(&st) {
                libc::S_IFLNK
                    if sys::readlink_at(dirfd, &name).ok().as_deref()
                        == Some(target.as_bytes()) =>
                {
                    return Ok(Existing::Kept);
                }
                libc::S_IFDIR => {
                    return Err(op_err("link", path, "the image has a directory there"));
                }
                _ => {}
            }
            sys::unlink_at(dirfd, &name).map_err(|e| op_err("replace", path, e))?;
            existing = Existing::Replaced;
        }
        sys::symlink_at(&target_c, dirfd, &name).map_err(|e| op_err("create symlink", path, e))?;
        Ok(existing)
    }

    /// The content of a regular file, or None when absent or not a regular file; at most
    /// `limit` bytes are accepted.
    pub fn read_file(&self, path: &str, limit: u64) -> Result<Option<Vec<u8>>, RootfsError> {
        let Some((file, st)) = self.open_regular(path)? else {
            return Ok(None);
        };
        if st.st_size as u64 > limit {
            return Err(op_err("read", path, format!("larger than {limit} bytes")));
        }
        let mut out = Vec::with_capacity(st.st_size as usize);
        file.take(limit)
            .read_to_end(&mut out)
            .map_err(|e| op_err("read", path, e))?;
        Ok(Some(out))
    }

    /// A regular file opened for reading, with its status, or None when absent or not a
    /// regular file (a link in its place counts as no file).
    pub(crate) fn open_regular(
        &self,
        path: &str,
    ) -> Result<Option<(std::fs::File, libc::stat)>, RootfsError> {
        let (dir, name) = split(path)?;
        let Ok(dir) = self.dir_if_exists(dir) else {
            return Ok(None);
        };
        // O_PATH first: opening an image's device node or FIFO for real could have side
        // effects on the host (a watchdog arms on open). O_NOFOLLOW: a link in the image's
        // place is treated as no file at all.
        let Some(handle) = sys::open_at(dir.as_fd(), &name, libc::O_PATH, 0).ok() else {
            return Ok(None);
        };
        let st = sys::fstat(handle.as_fd()).map_err(|e| op_err("inspect", path, e))?;
        if sys::file_type(&st) != libc::S_IFREG {
            return Ok(None);
        }
        // The same inode, now known to be a regular file, opened for reading: through the
        // host's /proc (5 system calls), else through pathrs's own verified procfs (~70).
        let file = match sys::reopen_through_proc(handle.as_fd(), &st, libc::O_RDONLY) {
            Ok(fd) => std::fs::File::from(fd),
            Err(e) => {
                tracing::debug!(path, error = %e, "reopening through pathrs's procfs");
                pathrs::Handle::from_fd(handle)
                    .reopen(pathrs::flags::OpenFlags::O_RDONLY)
                    .map_err(|e| op_err("open", path, e))?
            }
        };
        Ok(Some((file, st)))
    }

    /// An existing directory, without creating it.
    pub(crate) fn dir_if_exists(&self, dir: &str) -> Result<Rc<pathrs::Handle>, RootfsError> {
        let fail = |e: &dyn std::fmt::Display| op_err("open directory", dir, e);
        let parts = components(dir).map_err(|e| fail(&e))?;
        match self.walk(&parts).map_err(|e| fail(&e))? {
            (handle, depth) if depth == parts.len() => Ok(handle),
            _ => Err(fail(&"no such directory")),
        }
    }

    /// Writes `contents` to a new temporary file beside `path`, then renames it over `path`,
    /// so readers see the old or the new file, never a mix, and a link at `path` is replaced.
    pub fn replace_file(&self, path: &str, contents: &[u8], mode: u32) -> Result<(), RootfsError> {
        let (dir, name) = split(path)?;
        let dir = self.dir(path, dir)?;
        let dirfd = dir.as_fd();
        let tmp = CString::new(format!(
            ".{}.nvhook-{}",
            name.to_string_lossy(),
            std::process::id()
        ))
        .map_err(|e| op_err("write", path, e))?;
        let fd = sys::open_at(
            dirfd,
            &tmp,
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
            mode,
        )
        .map_err(|e| op_err("create temporary file for", path, e))?;
        let written = std::fs::File::from(fd)
            .write_all(contents)
            .and_then(|()| sys::rename_at(dirfd, &tmp, &name));
        if let Err(e) = written {
            let _ = sys::unlink_at(dirfd, &tmp);
            return Err(op_err("write", path, e));
        }
        Ok(())
    }

    /// An O_PATH handle of an existing path, following symlinks inside the root.
    pub fn resolve(&self, path: &str) -> Option<pathrs::Handle> {
        self.root.resolve(path).ok()
    }

    /// `path` with every link on it resolved inside the rootfs, as a path of the container.
    pub fn container_path(&self, path: &str) -> Option<String> {
        let handle = self.resolve(path)?;
        let at = |fd: std::os::fd::BorrowedFd| {
            std::fs::read_link(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&fd)
            ))
            .ok()
        };
        let (root, found) = (at(self.root.as_fd())?, at(handle.as_fd())?);
        let inside = found.strip_prefix(&root).ok()?.to_str()?;
        Some(format!("/{inside}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_paths() {
        let (d, n) = split("/usr/lib/libcuda.so.1").unwrap();
        assert_eq!(d, "/usr/lib");
        assert_eq!(n.to_str().unwrap(), "libcuda.so.1");
        let (d, _) = split("/x").unwrap();
        assert_eq!(d, "/");
        assert!(split("/usr/..").is_err());
        assert!(split("/usr/").is_err());
        assert!(split("nodir").is_err());
    }

    #[test]
    fn the_hosts_root_is_refused_by_any_name() {
        let tmp = tempfile::tempdir().unwrap();
        // `/`, a path that resolves to it, and a link to it (Root::open refuses the link).
        for path in ["/".into(), tmp.path().join("../../../..")] {
            let e = Rootfs::open(&path)
                .err()
                .expect("the host's root is refused");
            assert!(matches!(e, RootfsError::HostRoot { .. }), "{path:?}: {e}");
            assert!(e.to_string().contains("root.path"), "{e}");
        }
        assert!(Rootfs::open(tmp.path()).is_ok());
    }

    #[test]
    fn operations_stay_inside_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        // Absolute symlinks that would escape if resolved on the host: inside the root
        // they name root/<same path>.
        std::os::unix::fs::symlink(&outside, root.join("usr")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("lib")).unwrap();
        let inside = root.join(outside.strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inside).unwrap();
        std::os::unix::fs::symlink("/outside-file", root.join("etc/ld.so.cache")).unwrap();
        let r = Rootfs::open(&root).unwrap();
        r.make_symlink("/usr/lib/libcuda.so", "libcuda.so.1")
            .unwrap();
        r.replace_file("/etc/ld.so.cache", b"cache", 0o644).unwrap();
        let (_fd, existing) = r
            .mount_target("/usr/bin/nvidia-smi", MountKind::File)
            .unwrap();
        assert_eq!(existing, Existing::Created);
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        assert!(!tmp.path().join("outside-file").exists());
        assert!(inside.join("lib/libcuda.so").symlink_metadata().is_ok());
        assert!(inside.join("bin/nvidia-smi").is_file());
        // The link at /etc/ld.so.cache was replaced, not followed.
        assert_eq!(
            std::fs::read(root.join("etc/ld.so.cache")).unwrap(),
            b"cache"
        );
        assert_eq!(
            r.read_file("/etc/ld.so.cache", 100).unwrap().unwrap(),
            b"cache"
        );
        assert!(r.read_file("/etc/ld.so.cache", 2).is_err());
        // A dangling escape is refused rather than created anywhere.
        std::fs::remove_dir_all(&inside).unwrap();
        let r = Rootfs::open(&root).unwrap();
        let e = r
            .make_symlink("/lib/x/libcuda.so", "libcuda.so.1")
            .unwrap_err();
        assert!(
            e.to_string().contains(&format!(
                "the image's /lib is a link to {} that leads nowhere",
                outside.display()
            )),
            "{e}"
        );
        std::fs::write(root.join("etc/vulkan"), b"a file").unwrap();
        let e = r
            .replace_file("/etc/vulkan/icd.d/x.json", b"", 0o644)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("the image's /etc/vulkan is not a directory"),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn probe_follows_links_inside_the_root_only() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::os::unix::fs::symlink("lib", root.join("usr/lib64")).unwrap();
        std::fs::write(root.join("etc/cache.real"), b"").unwrap();
        std::os::unix::fs::symlink("/etc/cache.real", root.join("etc/ld.so.cache")).unwrap();
        // A link that names a host file: inside the root it names root/bin/sh, absent.
        assert!(Path::new("/bin/sh").exists());
        std::os::unix::fs::symlink("/../../bin/sh", root.join("etc/debian_version")).unwrap();
        let image = Rootfs::open(&root).unwrap().probe();
        assert_eq!(
            image,
            ImageInfo {
                debian: false,
                has_usr_lib64: true,
                has_ldcache: true,
                cuda_compat: None,
            }
        );
        std::fs::remove_file(root.join("usr/lib64")).unwrap();
        std::fs::write(root.join("usr/lib64"), b"a file").unwrap();
        assert!(!Rootfs::open(&root).unwrap().probe().has_usr_lib64);
    }

    /// Whether anything opened `path` for I/O (O_PATH does not count) while `f` ran.
    fn opened_during(path: &Path, f: impl FnOnce()) -> bool {
        // SAFETY: plain syscalls on a descriptor owned here; the buffer outlives the read.
        unsafe {
            let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
            assert!(fd >= 0);
            let p = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
            assert!(libc::inotify_add_watch(fd, p.as_ptr(), libc::IN_OPEN) >= 0);
            f();
            let mut buf = [0u8; 4096];
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            libc::close(fd);
            n > 0
        }
    }

    #[test]
    fn read_file_never_opens_a_special_file() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("etc")).unwrap();
        let fifo = tmp.path().join("etc/ld.so.cache");
        let c = CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: c is NUL-terminated.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let r = Rootfs::open(tmp.path()).unwrap();
        let opened = opened_during(&fifo, || {
            assert_eq!(r.read_file("/etc/ld.so.cache", 100).unwrap(), None);
        });
        assert!(!opened, "read_file opened the image's FIFO");
        // The control: a regular file is opened, and the watch sees it.
        std::fs::remove_file(&fifo).unwrap();
        std::fs::write(&fifo, b"cache").unwrap();
        let opened = opened_during(&fifo, || {
            assert_eq!(
                r.read_file("/etc/ld.so.cache", 100).unwrap().unwrap(),
                b"cache"
            );
        });
        assert!(opened);
    }

    #[test]
    fn reopening_through_proc_gives_the_same_inode_or_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::write(&a, b"first").unwrap();
        std::fs::write(&b, b"second").unwrap();
        let dir = std::fs::File::open(tmp.path()).unwrap();
        let handle = sys::open_at(dir.as_fd(), c"a", libc::O_PATH, 0).unwrap();
        let st = sys::fstat(handle.as_fd()).unwrap();
        let reopened = sys::reopen_through_proc(handle.as_fd(), &st, libc::O_RDONLY).unwrap();
        let mut text = String::new();
        std::fs::File::from(reopened)
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "first");
        // A descriptor whose inode is not the one checked is refused, not read.
        let other = sys::fstat(std::fs::File::open(&b).unwrap().as_fd()).unwrap();
        assert!(sys::reopen_through_proc(handle.as_fd(), &other, libc::O_RDONLY).is_err());
    }

    #[test]
    fn mount_target_kinds() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("usr/bin/nvidia-smi")).unwrap();
        std::fs::create_dir_all(tmp.path().join("lib")).unwrap();
        std::fs::write(tmp.path().join("lib/libcuda.so.1"), b"image's own").unwrap();
        let r = Rootfs::open(tmp.path()).unwrap();
        let e = r
            .mount_target("/usr/bin/nvidia-smi", MountKind::File)
            .unwrap_err();
        assert!(e.to_string().contains("directory where a file"), "{e}");
        let (_, existing) = r
            .mount_target("/lib/libcuda.so.1", MountKind::File)
            .unwrap();
        assert_eq!(existing, Existing::Replaced);
        let (_, existing) = r.mount_target("/tmp/nvidia-mps", MountKind::Dir).unwrap();
        assert_eq!(existing, Existing::Created);
        assert_eq!(
            r.make_symlink("/lib/libcuda.so.1", "libcuda.so.550")
                .unwrap(),
            Existing::Replaced
        );
        assert_eq!(
            r.make_symlink("/lib/libcuda.so.1", "libcuda.so.550")
                .unwrap(),
            Existing::Kept
        );
    }
}
