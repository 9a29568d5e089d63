//! A file's identity and version: which inode, and whether it changed since.

use serde::{Deserialize, Serialize};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// How long ago a file or directory must have last changed for what was read from it to be
/// kept as current: within the filesystem clock's granularity, a later change could leave its
/// times as they were.
pub const SETTLED: std::time::Duration = std::time::Duration::from_secs(2);

/// Device, inode, size, and change times: a file replaced by rename, rewritten in place or
/// touched compares unequal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileId {
    /// The identity of what `path` names (symlinks followed), None when it cannot be read.
    pub fn of(path: &Path) -> Option<FileId> {
        std::fs::metadata(path).ok().map(|m| Self::of_metadata(&m))
    }

    /// The identity of an open file, or of the directory an `O_PATH` descriptor names.
    pub fn of_fd(fd: BorrowedFd) -> Option<FileId> {
        let st = nix::sys::stat::fstat(fd).ok()?;
        Some(FileId {
            dev: st.st_dev,
            ino: st.st_ino,
            size: u64::try_from(st.st_size).ok()?,
            mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
            ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
        })
    }

    pub fn of_metadata(m: &std::fs::Metadata) -> FileId {
        FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        }
    }

    /// Whether it changed within `margin` of `now`, or claims a time after it. A change made
    /// within the filesystem clock's granularity of the one seen here may leave the times as
    /// they were: what was read from such a file or directory is not kept as still current.
    pub fn changed_lately(&self, now: std::time::SystemTime, margin: std::time::Duration) -> bool {
        let Ok(since_epoch) = now.duration_since(std::time::UNIX_EPOCH) else {
            return true;
        };
        let now_ns = i128::try_from(since_epoch.as_nanos()).unwrap_or(i128::MAX);
        let margin_ns = i128::try_from(margin.as_nanos()).unwrap_or(i128::MAX);
        self.mtime_ns.max(self.ctime_ns) > now_ns.saturating_sub(margin_ns)
    }
}

fn ns(seconds: i64, nanos: i64) -> i128 {
    i128::from(seconds) * 1_000_000_000 + i128::from(nanos)
}
