//! The driver's files of each driver directory an image searches
//! ([`crate::plan::driver_dirs`]), gathered into one directory where the engine sees it, so
//! that the runtime makes one recursive bind mount where it would make one per file: runc's
//! own work per bind mount is most of what NRI's `mounts` mode costs a start
//! (docs/performance.md).
//!
//! The directories live in a tmpfs of nvhook's own (`driver-dirs` in its state directory),
//! mounted in the engine's mount namespace ([`super::engine_view`]), private: nothing made
//! there propagates to the host's other mount namespaces, and a container's copy is its own,
//! so unmounting them on the host leaves every running container's files in place. Each file
//! is a read-only, nosuid, nodev bind of its source, opened and checked as the hook opens a
//! mount's source. A directory is named by what it holds (names, sources, and the sources'
//! identities), and is complete once it has its name: a driver whose files changed gets a
//! new one.

use super::engine_view::EngineView;
use crate::hook::HookError;
use crate::hook::effects::open_source;
use crate::plan::{Mount, MountKind};
use crate::rootfs::sys;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The tmpfs's name in nvhook's state directory.
pub const DIR_NAME: &str = "driver-dirs";

#[derive(Debug, thiserror::Error)]
pub enum GatherError {
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Source(#[from] HookError),
    #[error("a driver file's name {0:?} is not a plain file name")]
    Name(String),
}

/// The gathered directories under `state_dir`, mounted on first use, where the engine sees
/// them.
pub struct DriverTrees {
    root: PathBuf,
    view: EngineView,
}

impl DriverTrees {
    pub fn new(state_dir: &Path, view: EngineView) -> DriverTrees {
        DriverTrees {
            root: state_dir.join(DIR_NAME),
            view,
        }
    }

    /// The directory holding each of `sets` (each file a name and its host source), in order,
    /// each made once; all of them in one visit to the engine's mount namespace, whose entry
    /// is the error when it fails.
    pub fn gather(
        &self,
        sets: &[&[(&str, &Path)]],
    ) -> Result<Vec<Result<PathBuf, GatherError>>, GatherError> {
        self.view
            .run(|| sets.iter().map(|files| self.gather_here(files)).collect())
            .map_err(|source| GatherError::Io {
                op: "enter the engine's mount namespace for",
                path: self.root.clone(),
                source,
            })
    }

    /// One set of [`DriverTrees::gather`], in the engine's mount namespace.
    fn gather_here(&self, files: &[(&str, &Path)]) -> Result<PathBuf, GatherError> {
        let name = name_of(files)?;
        let building = format!(".{name}.{}", std::process::id());
        let building_path = self.root.join(&building);
        let path = self.root.join(&name);
        let root = self.root()?;
        let c_name = cstring(&name)?;
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| GatherError::Io { op, path, source }
        };
        if sys::lstat_at(root.as_fd(), &c_name)
            .map_err(io("look for", &path))?
            .is_some()
        {
            return Ok(path);
        }
        let c_building = cstring(&building)?;
        sys::mkdir_at(root.as_fd(), &c_building, 0o755).map_err(io("create", &building_path))?;
        let filled = fill(root.as_fd(), &c_building, &building_path, files).and_then(|()| {
            sys::rename_at(root.as_fd(), &c_building, &c_name).map_err(io("name", &path))
        });
        match filled {
            Ok(()) => {
                tracing::info!(dir = %path.display(), files = files.len(), "NRI: driver files gathered into one directory");
                Ok(path)
            }
            Err(e) => {
                remove(&building_path);
                // Made meanwhile by another plugin: the same files.
                match path.is_dir() {
                    true => Ok(path),
                    false => Err(e),
                }
            }
        }
    }

    /// The tmpfs at `root`, as the runtime will find it by path: opened for each container,
    /// and mounted private again where it is gone (unmounted by hand).
    fn root(&self) -> Result<OwnedFd, GatherError> {
        let root = &self.root;
        let io = |op| {
            move |source| GatherError::Io {
                op,
                path: root.clone(),
                source,
            }
        };
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)
                .open(root)
                .map(OwnedFd::from)
                .map_err(io("open"))
        };
        let fd = match open() {
            Ok(fd) => fd,
            Err(_) => {
                std::fs::create_dir_all(root).map_err(io("create"))?;
                open()?
            }
        };
        if sys::is_mount_root(fd.as_fd()).map_err(io("inspect"))? {
            return Ok(fd);
        }
        let tmpfs = sys::new_tmpfs(c"0555").map_err(io("make a tmpfs for"))?;
        // Private: the files bound in it propagate nowhere, and copies of it are their own.
        sys::set_attrs(tmpfs.as_fd(), 0).map_err(io("make private"))?;
        sys::attach(tmpfs.as_fd(), fd.as_fd()).map_err(io("mount a tmpfs on"))?;
        MOUNTED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((root.clone(), self.view.clone()));
        open()
    }
}

/// The tmpfs this process mounted, and where, for [`detach_all`].
static MOUNTED: std::sync::Mutex<Vec<(PathBuf, EngineView)>> = std::sync::Mutex::new(Vec::new());

/// Unmounts the gathered directories this process made (the plugin is stopping). Running
/// containers keep their own copies.
pub fn detach_all() {
    let mounted = std::mem::take(&mut *MOUNTED.lock().unwrap_or_else(|e| e.into_inner()));
    for (root, view) in mounted {
        if let Ok(Ok(())) = view.run(|| sys::unmount_lazily(&root)) {
            tracing::info!(dir = %root.display(), "NRI: gathered driver directories unmounted");
        }
    }
}

/// Binds each of `files` into the new directory `dir` (in `root`).
fn fill(
    root: std::os::fd::BorrowedFd,
    dir: &CString,
    dir_path: &Path,
    files: &[(&str, &Path)],
) -> Result<(), GatherError> {
    let io = |op, path: PathBuf| move |source| GatherError::Io { op, path, source };
    let dir = sys::open_at(root, dir, libc::O_PATH | libc::O_DIRECTORY, 0)
        .map_err(io("open", dir_path.to_path_buf()))?;
    for &(name, source) in files {
        let tree = open_source(&Mount {
            source: source.to_path_buf(),
            destination: name.to_string(),
            kind: MountKind::File,
        })?;
        let at = dir_path.join(name);
        let c_name = cstring(name)?;
        sys::open_at(
            dir.as_fd(),
            &c_name,
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
            0o644,
        )
        .map_err(io("create", at.clone()))?;
        let target =
            sys::open_at(dir.as_fd(), &c_name, libc::O_PATH, 0).map_err(io("open", at.clone()))?;
        sys::attach(tree.as_fd(), target.as_fd()).map_err(io("mount on", at))?;
    }
    Ok(())
}

/// Unmounts what a failed build bound, and removes its directory.
fn remove(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let _ = sys::unmount_lazily(&entry.path());
    }
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), "cannot remove a half-gathered directory: {e}");
    }
}

/// The directory's name: what it holds and the identity of each source, as sixteen hex
/// digits.
fn name_of(files: &[(&str, &Path)]) -> Result<String, GatherError> {
    let mut sorted = files.to_vec();
    sorted.sort();
    let mut bytes = Vec::new();
    for (name, source) in sorted {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(GatherError::Name(name.to_string()));
        }
        let meta = std::fs::metadata(source).map_err(|e| GatherError::Io {
            op: "inspect",
            path: source.to_path_buf(),
            source: e,
        })?;
        bytes.extend(name.bytes().chain([0]));
        bytes.extend(source.as_os_str().as_bytes().iter().copied().chain([0]));
        for n in [
            meta.dev(),
            meta.ino(),
            meta.size(),
            meta.mtime() as u64,
            meta.mtime_nsec() as u64,
        ] {
            bytes.extend(n.to_le_bytes());
        }
    }
    Ok(format!("{:016x}", nvhook_model::stable_hash::fnv1a(bytes)))
}

fn cstring(name: &str) -> Result<CString, GatherError> {
    CString::new(name).map_err(|_| GatherError::Name(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory's name follows what it holds: the same files give the same name in any
    /// order, a source rewritten in place gives another, and a name that is not a plain file
    /// name is refused.
    #[test]
    fn a_directory_is_named_by_its_files_and_their_identities() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "one").unwrap();
        std::fs::write(&b, "two").unwrap();
        let files = [
            ("libcuda.so.1", a.as_path()),
            ("libnvidia-ml.so.1", b.as_path()),
        ];
        let name = name_of(&files).unwrap();
        assert_eq!(name.len(), 16);
        let reversed = [files[1], files[0]];
        assert_eq!(name_of(&reversed).unwrap(), name);
        // Another name for the same source is another directory.
        assert_ne!(
            name_of(&[("libcuda.so", a.as_path())]).unwrap(),
            name_of(&files[..1]).unwrap()
        );
        // A driver file replaced (a new inode, as an upgrade makes it).
        std::fs::remove_file(&a).unwrap();
        std::fs::write(&a, "one, again").unwrap();
        assert_ne!(name_of(&files).unwrap(), name);
        // A state directory nothing can be made in: an error for the caller to log.
        let trees = DriverTrees::new(&a, EngineView::Shared);
        assert!(matches!(
            trees.gather(&[&files]).unwrap().as_slice(),
            [Err(GatherError::Io { op: "create", .. })]
        ));
        for bad in ["", ".", "..", "lib/cuda"] {
            assert!(
                matches!(name_of(&[(bad, a.as_path())]), Err(GatherError::Name(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            name_of(&[("gone", dir.path().join("gone").as_path())]),
            Err(GatherError::Io { op: "inspect", .. })
        ));
    }
}
