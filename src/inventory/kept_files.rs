//! A search for the driver's files, kept while a search would find the same: in memory by a
//! process that serves many containers (`nvhook nri`), and for the next start's process in a
//! file beside NVML's cached answer, as private as it.
//!
//! What a search finds depends on the driver root, its loader cache, the driver version, the
//! scope, the firmware directories, and the directories it looks into. A directory's inode and
//! times change whenever an entry in it is made, removed or renamed, as a driver install or
//! upgrade does to every directory it puts files in; so a search is used again only while all
//! of these are as they were. A file rewritten in place is not seen this way (the installers
//! replace files), and the daemons' sockets are not kept at all: they come and go with their
//! daemons, in directories that change all the time.

use super::{DriverFiles, Scope};
use crate::config::Config;
use crate::file_id::{FileId, SETTLED};
use crate::private_file;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What a search for the driver's files depends on besides the directories it looks into.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Key {
    /// Canonical: a driver root that now leads elsewhere is another root.
    pub driver_root: PathBuf,
    pub ld_cache: Option<FileId>,
    pub version: String,
    pub graphics: bool,
    pub firmware_dirs: Vec<String>,
}

/// A search's files but the sockets, with what they were found from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Kept {
    /// Made by this process's search, not read: what a file store must write.
    #[serde(skip)]
    pub(super) made_now: bool,
    /// [`FORMAT`] when written.
    format: u32,
    key: Key,
    /// Every directory inside the driver root the search looked into, with its identity.
    dirs: Vec<(PathBuf, FileId)>,
    files: DriverFiles,
    /// `libnvidia-ml.so.1`'s entry in the loader cache `key.ld_cache` names: while the cache
    /// is that file, a start finds NVML's library without reading it.
    nvml: Option<String>,
}

/// The layout of [`Kept`] and [`DriverFiles`] in the file; raised whenever either changes, so
/// that a file an older nvhook wrote is a miss. 2: NVML's library as the loader cache lists it.
const FORMAT: u32 = 2;

impl Kept {
    /// The search's result, kept unless some of what it read cannot be identified or changed
    /// too recently to tell a later change by its times.
    pub(super) fn of(
        key: Key,
        consulted: Vec<(PathBuf, Option<FileId>)>,
        files: &DriverFiles,
        nvml: Option<String>,
        now: SystemTime,
    ) -> Option<Kept> {
        let settled = |id: &FileId| !id.changed_lately(now, SETTLED);
        key.ld_cache.as_ref().filter(|id| settled(id))?;
        let dirs = consulted
            .into_iter()
            .map(|(dir, id)| Some((dir, id.filter(settled)?)))
            .collect::<Option<Vec<_>>>()?;
        Some(Kept {
            made_now: true,
            format: FORMAT,
            key,
            dirs,
            files: files.clone(),
            nvml,
        })
    }

    /// `libnvidia-ml.so.1`'s entry in the loader cache whose identity is now `ld_cache`, where
    /// that is the cache this search read.
    pub(super) fn nvml_entry(&self, ld_cache: Option<&FileId>) -> Option<&str> {
        let same_cache = ld_cache.is_some() && self.key.ld_cache.as_ref() == ld_cache;
        self.nvml
            .as_deref()
            .filter(|_| self.format == FORMAT && same_cache)
    }

    /// The files, when a search for `key` now would find them: the same key, and every
    /// directory the search looked into as it was.
    pub(super) fn serves(&self, key: &Key) -> Option<&DriverFiles> {
        let unchanged = || {
            self.dirs
                .iter()
                .all(|(dir, id)| FileId::of(dir).as_ref() == Some(id))
        };
        (self.format == FORMAT && &self.key == key && unchanged()).then_some(&self.files)
    }
}

/// The file beside NVML's cached answer, one per scope (so that compute and graphics starts
/// on one node do not replace each other's); none where that cache is off.
pub(super) fn path(config: &Config, scope: Scope) -> Option<PathBuf> {
    let name = match scope.graphics {
        true => "driver-files-graphics.json",
        false => "driver-files.json",
    };
    Some(config.nvml_cache()?.parent()?.join(name))
}

pub(super) fn read(path: &Path) -> Option<Kept> {
    let (bytes, _) = private_file::read(path)?;
    crate::whole_file::json(&bytes)
}

/// Best effort: a host where it cannot be written searches again at the next start.
pub(super) fn write(path: &Path, kept: &Kept) {
    if let Err(e) = private_file::write_json(path, kept) {
        tracing::debug!(path = %path.display(), error = %e, "driver files not kept");
    }
}
