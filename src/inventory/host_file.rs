//! A driver file found by path under the driver root, and the root it is looked up in: shared
//! by the driver's own files and the graphics stack's.

use super::HostFile;
use super::resolve::{Found, Resolver};
use crate::capability::Capability;
use crate::file_id::FileId;
use std::path::{Path, PathBuf};

/// The driver root, canonical, and the resolver its files are looked up with.
pub(super) struct DriverRoot {
    path: PathBuf,
    resolver: Resolver,
}

impl DriverRoot {
    /// The root at `root`; `recording` for a search to be kept, whose directories' identities
    /// are then taken as they are opened ([`DriverRoot::consulted`]).
    pub(super) fn new(root: &Path, recording: bool) -> DriverRoot {
        let resolver = Resolver::new(recording);
        let path = match std::fs::canonicalize(root) {
            Ok(path) => {
                resolver.start_at(&path);
                path
            }
            Err(_) => root.to_path_buf(),
        };
        DriverRoot { path, resolver }
    }

    /// The host file `path` (absolute, in the driver root's terms) ends at, when it exists
    /// and stays inside the root.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn canonical(&self, path: &str) -> Option<PathBuf> {
        self.found(path).map(|found| found.path)
    }

    fn found(&self, path: &str) -> Option<Found> {
        let found = self
            .resolver
            .canonical_found(&self.path.join(path.trim_start_matches('/')))?;
        found.path.starts_with(&self.path).then_some(found)
    }

    /// The entries of directory `dir` (absolute, in the driver root's terms), when it exists
    /// inside the root: listed through the resolver, so that it counts as looked into.
    pub(super) fn list(&self, dir: &str) -> Option<std::fs::ReadDir> {
        let host = self
            .resolver
            .directory(&self.path.join(dir.trim_start_matches('/')))?;
        if !host.starts_with(&self.path) {
            return None;
        }
        std::fs::read_dir(host).ok()
    }

    /// The directories inside the root that lookups and listings have looked into, with their
    /// identities then: what their results depend on.
    pub(super) fn consulted(&self) -> Vec<(PathBuf, Option<FileId>)> {
        let mut dirs = self.resolver.consulted();
        dirs.retain(|(dir, _)| dir.starts_with(&self.path));
        dirs
    }

    pub(super) fn existing(&self, path: &str, capability: Option<Capability>) -> Option<HostFile> {
        let found = self.found(path)?;
        Some(HostFile {
            capability,
            is_dir: found.is_dir,
            host_path: found.path,
            container_path: path.to_string(),
        })
    }
}

pub(super) fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}
