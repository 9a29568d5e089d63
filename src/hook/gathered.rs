//! Driver files gathered on the host into directories named by what they hold, so that a
//! container gets each directory as one recursive bind where it would get a mount per file
//! (and a link per library): the NRI plugin's driver directories (`crate::nri::driver_trees`)
//! and the CDI hook's kept trees ([`super::kept_trees`]).
//!
//! The directories live in a tmpfs of nvhook's own, mounted private on first use: nothing made
//! there propagates to the host's other mount namespaces, and a container's copy is its own,
//! so unmounting a directory's files on the host leaves every running container's in place.
//! Each file is a read-only, nosuid, nodev bind of its source, opened and checked as the hook
//! opens a mount's source. A directory is named by what it holds (paths, links, sources and
//! the sources' identities) and is complete once it has its name: a driver whose files changed
//! gets a new one, and making one removes those whose sources changed (their list is kept
//! beside them, `.NAME.sources`).

use super::HookError;
use super::effects::{fill_tree, open_source};
use crate::plan::{Mount, MountKind};
use crate::rootfs::sys;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

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
    #[error("{0:?} is not a plain relative path for a gathered file or link")]
    Name(String),
    #[error("cannot fill {}: {source}", path.display())]
    Fill {
        path: PathBuf,
        #[source]
        source: crate::rootfs::RootfsError,
    },
}

/// What a gathered directory holds: each file by its path in the directory and its host
/// source, each link by its path and its target.
#[derive(Debug, Default)]
pub struct Contents<'a> {
    pub files: Vec<(&'a str, &'a Path)>,
    pub links: Vec<(&'a str, &'a str)>,
}

/// A gathered directory, and whether getting it made it (else another's, made before).
#[derive(Debug)]
pub struct Gathered {
    pub path: PathBuf,
    pub made: bool,
}

/// The gathered directories in the tmpfs at `root`.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    pub fn new(root: PathBuf) -> Store {
        Store { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The store's tmpfs, mounted private where it is not (never mounted, or unmounted by
    /// hand).
    pub fn open(&self) -> Result<OpenStore<'_>, GatherError> {
        let (root, mounted) = self.open_root()?;
        Ok(OpenStore {
            store: self,
            root,
            mounted,
        })
    }

    /// The tmpfs at the store's root, and whether this call mounted it: mounted private again
    /// where it is gone (never mounted, or unmounted by hand).
    fn open_root(&self) -> Result<(OwnedFd, bool), GatherError> {
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
                // Root's alone, as nvhook's state directory is (private_file): whatever the
                // umask, which the hook sets to 0.
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(root)
                    .map_err(io("create"))?;
                open()?
            }
        };
        if sys::is_mount_root(fd.as_fd()).map_err(io("inspect"))? {
            return Ok((fd, false));
        }
        let tmpfs = sys::new_tmpfs(c"0555").map_err(io("make a tmpfs for"))?;
        sys::attach(tmpfs.as_fd(), fd.as_fd()).map_err(io("mount a tmpfs on"))?;
        // Private once attached, as a mount under a shared one (`/run` on a systemd host)
        // becomes shared: the files bound in it propagate nowhere, and copies of it are their
        // own. Its empty root may have been copied to the parent's peers meanwhile; they see
        // none of the binds.
        sys::set_attrs(tmpfs.as_fd(), 0).map_err(io("make private"))?;
        Ok((open()?, true))
    }

    /// Removes the directories other than `keep` whose sources changed (a driver upgraded,
    /// its files replaced), and those a process that is gone left half-gathered: their binds
    /// would keep the old files on the host's disk.
    fn remove_stale(&self, keep: &str) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str().filter(|n| *n != keep) else {
                continue;
            };
            if let Some(hidden) = name.strip_prefix('.') {
                // `.NAME.PID`, being gathered: left where that process is alive.
                let builder = hidden.rsplit_once('.').map(|(_, pid)| pid);
                let gone = builder.filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()));
                if gone.is_some_and(|pid| !Path::new("/proc").join(pid).exists()) {
                    remove(&entry.path());
                }
                continue;
            }
            let list = self.root.join(format!(".{name}.sources"));
            let current = std::fs::read_to_string(&list)
                .ok()
                .is_some_and(|text| sources_unchanged(&text));
            if !current {
                remove(&entry.path());
                let _ = std::fs::remove_file(&list);
                tracing::info!(dir = %entry.path().display(), "a gathered directory whose driver files changed removed");
            }
        }
    }
}

/// The store, its tmpfs open.
pub struct OpenStore<'s> {
    store: &'s Store,
    root: OwnedFd,
    /// The tmpfs was mounted by [`Store::open`].
    pub mounted: bool,
}

impl OpenStore<'_> {
    /// The directory holding `contents`, made where it is not yet.
    pub fn gather(&self, contents: &Contents) -> Result<Gathered, GatherError> {
        let (name, sources) = name_of(contents)?;
        let path = self.store.root.join(&name);
        let c_name = cstring(&name)?;
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| GatherError::Io { op, path, source }
        };
        let found = |made| Gathered {
            path: path.clone(),
            made,
        };
        let root = &self.root;
        if sys::lstat_at(root.as_fd(), &c_name)
            .map_err(io("look for", &path))?
            .is_some()
        {
            return Ok(found(false));
        }
        let building = format!(".{name}.{}", std::process::id());
        let building_path = self.store.root.join(&building);
        let c_building = cstring(&building)?;
        let list = self.store.root.join(format!(".{name}.sources"));
        sys::mkdir_at(root.as_fd(), &c_building, 0o755).map_err(io("create", &building_path))?;
        let filled = fill(root.as_fd(), &c_building, &building_path, contents)
            .and_then(|()| {
                crate::atomic_file::write_atomic(
                    &list,
                    sources_list(&sources).as_bytes(),
                    crate::atomic_file::NewFile::mode(0o600),
                )
                .map_err(io("write", &list))
            })
            .and_then(|()| {
                sys::rename_at(root.as_fd(), &c_building, &c_name).map_err(io("name", &path))
            });
        match filled {
            Ok(()) => {
                self.store.remove_stale(&name);
                Ok(found(true))
            }
            Err(e) => {
                remove(&building_path);
                // Made meanwhile by another process: the same files.
                match path.is_dir() {
                    true => Ok(found(false)),
                    false => Err(e),
                }
            }
        }
    }
}

/// Binds each file of `contents` into the new directory `dir` (in `root`), and makes its links.
fn fill(
    root: BorrowedFd,
    dir: &CString,
    dir_path: &Path,
    contents: &Contents,
) -> Result<(), GatherError> {
    let sources = (contents.files.iter())
        .map(|&(name, source)| {
            open_source(&Mount {
                source: source.to_path_buf(),
                destination: name.to_string(),
                kind: MountKind::File,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let files: Vec<(&str, BorrowedFd)> = (contents.files.iter().zip(&sources))
        .map(|(&(name, _), fd)| (name, fd.as_fd()))
        .collect();
    let dir = sys::open_at(root, dir, libc::O_PATH | libc::O_DIRECTORY, 0).map_err(|source| {
        GatherError::Io {
            op: "open",
            path: dir_path.to_path_buf(),
            source,
        }
    })?;
    let label = dir_path.display().to_string();
    fill_tree(dir.as_fd(), &label, &files, &contents.links).map_err(|source| GatherError::Fill {
        path: dir_path.to_path_buf(),
        source,
    })
}

/// Unmounts every mount under `dir` (a directory of the store, or a half-gathered one), and
/// removes it.
fn remove(dir: &Path) {
    fn unmount_below(dir: &Path) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => unmount_below(&path),
                Ok(t) if t.is_file() => {
                    let _ = sys::unmount_lazily(&path);
                }
                _ => {}
            }
        }
    }
    unmount_below(dir);
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), "cannot remove a gathered directory: {e}");
    }
}

/// A source's identity as a gathered directory depends on it: device, inode, size and time
/// (seconds, nanoseconds).
type Identity = [u64; 5];

/// Each source of a directory with its identity.
type Sources<'a> = Vec<(&'a Path, Identity)>;

fn identity(source: &Path) -> io::Result<Identity> {
    let meta = std::fs::metadata(source)?;
    Ok([
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime() as u64,
        meta.mtime_nsec() as u64,
    ])
}

/// The directory's name, as sixteen hex digits of what it holds and each source's identity;
/// and its sources with their identities, for [`sources_list`].
fn name_of<'a>(contents: &Contents<'a>) -> Result<(String, Sources<'a>), GatherError> {
    let mut files = contents.files.clone();
    files.sort();
    let mut links = contents.links.clone();
    links.sort();
    let mut bytes = Vec::new();
    let mut sources = Vec::with_capacity(files.len());
    for (name, source) in files {
        plain(name)?;
        if source.to_str().is_none_or(|s| s.contains('\n')) {
            return Err(GatherError::Name(source.display().to_string()));
        }
        let id = identity(source).map_err(|e| GatherError::Io {
            op: "inspect",
            path: source.to_path_buf(),
            source: e,
        })?;
        bytes.extend(name.bytes().chain([0]));
        bytes.extend(source.as_os_str().as_bytes().iter().copied().chain([0]));
        for n in id {
            bytes.extend(n.to_le_bytes());
        }
        sources.push((source, id));
    }
    // A link's part ends in a byte no file's part has there.
    for (path, target) in links {
        plain(path)?;
        bytes.extend(path.bytes().chain([0xff]));
        bytes.extend(target.bytes().chain([0]));
    }
    let name = format!("{:016x}", nvhook_model::stable_hash::fnv1a(bytes));
    Ok((name, sources))
}

/// A directory's list of sources kept beside it: one a line, its identity, then its path
/// (which [`name_of`] checked is UTF-8 without a newline).
fn sources_list(sources: &[(&Path, Identity)]) -> String {
    let line = |(source, [dev, ino, size, secs, nanos]): &(&Path, Identity)| {
        format!("{dev} {ino} {size} {secs} {nanos} {}\n", source.display())
    };
    sources.iter().map(line).collect()
}

/// Whether every source in a directory's list still has the identity listed.
fn sources_unchanged(list: &str) -> bool {
    list.lines().all(|line| {
        let mut parts = line.splitn(6, ' ');
        let listed: Vec<u64> = parts
            .by_ref()
            .take(5)
            .filter_map(|n| n.parse().ok())
            .collect();
        let source = parts.next().map(Path::new);
        source.is_some_and(|s| identity(s).is_ok_and(|id| id[..] == listed[..]))
    })
}

/// A relative path of plain components (no `.`, `..` or empty one).
fn plain(path: &str) -> Result<(), GatherError> {
    match path
        .split('/')
        .all(|part| !part.is_empty() && part != "." && part != "..")
    {
        true => Ok(()),
        false => Err(GatherError::Name(path.to_string())),
    }
}

fn cstring(name: &str) -> Result<CString, GatherError> {
    CString::new(name).map_err(|_| GatherError::Name(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory's name follows what it holds: the same files give the same name in any
    /// order, a source rewritten in place gives another, and so does another link; a path
    /// that is not plain is refused. Its list of sources tells when one changed.
    #[test]
    fn a_directory_is_named_by_its_files_links_and_their_identities() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "one").unwrap();
        std::fs::write(&b, "two").unwrap();
        let contents = |files: &[(&'static str, &Path)], links: &[(&'static str, &'static str)]| {
            let named = name_of(&Contents {
                files: files.iter().map(|&(n, p)| (n, p)).collect(),
                links: links.to_vec(),
            });
            named.map(|(name, sources)| (name, sources_list(&sources)))
        };
        let files = [
            ("lib64/libcuda.so.1", a.as_path()),
            ("libnvidia-ml.so.1", b.as_path()),
        ];
        let (name, list) = contents(&files, &[]).unwrap();
        assert_eq!(name.len(), 16);
        assert!(sources_unchanged(&list));
        let reversed = [files[1], files[0]];
        assert_eq!(contents(&reversed, &[]).unwrap().0, name);
        // Another name for the same source is another directory, and so is a link more.
        assert_ne!(
            contents(&[("libcuda.so", a.as_path())], &[]).unwrap().0,
            contents(&files[..1], &[]).unwrap().0
        );
        let linked = contents(&files, &[("lib64/libcuda.so", "libcuda.so.1")]);
        assert_ne!(linked.unwrap().0, name);
        // A driver file replaced (a new inode, as an upgrade makes it).
        std::fs::remove_file(&a).unwrap();
        std::fs::write(&a, "one, again").unwrap();
        assert_ne!(contents(&files, &[]).unwrap().0, name);
        assert!(!sources_unchanged(&list));
        for bad in ["", ".", "..", "lib//cuda", "/lib", "lib/../cuda"] {
            assert!(
                matches!(
                    contents(&[(bad, a.as_path())], &[]),
                    Err(GatherError::Name(_))
                ),
                "{bad:?}"
            );
            assert!(
                matches!(contents(&[], &[(bad, "x")]), Err(GatherError::Name(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            contents(&[("gone", dir.path().join("gone").as_path())], &[]),
            Err(GatherError::Io { op: "inspect", .. })
        ));
        // A store nothing can be made in: an error for the caller to log.
        let store = Store::new(a.clone());
        assert!(matches!(
            store.open(),
            Err(GatherError::Io { op: "create", .. })
        ));
        // A store made where nothing was: its directories are root's alone, and it is a
        // private tmpfs of its own.
        let store = Store::new(dir.path().join("state/store"));
        let opened = store.open().expect("open a new store (as root)");
        assert!(opened.mounted);
        let mode = |at: &str| std::fs::metadata(dir.path().join(at)).unwrap().mode() & 0o7777;
        assert_eq!(mode("state/store"), 0o555);
        drop(opened);
        assert!(!store.open().unwrap().mounted);
        sys::unmount_lazily(store.root()).unwrap();
        assert_eq!((mode("state"), mode("state/store")), (0o700, 0o700));
    }
}
