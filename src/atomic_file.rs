//! The one way nvhook replaces a file on the host: a new file beside it, renamed over it, so
//! that a reader (an engine watching `/etc/cdi`, runc reading `config.json`, a concurrent
//! hook reading NVML's cache) or a crash sees the old file or the new one, never half.

use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How the new file is made.
#[derive(Debug, Clone, Copy)]
pub struct NewFile {
    /// Set exactly, whatever the umask.
    pub mode: u32,
    /// `(uid, gid)` to give the new file; `None` keeps the writer's.
    pub owner: Option<(u32, u32)>,
    /// Flush the data and the directory entry before returning: for files an admin relies on
    /// surviving a power loss (engine configs), not for per-start scratch files.
    pub durable: bool,
}

impl NewFile {
    pub const fn mode(mode: u32) -> NewFile {
        NewFile {
            mode,
            owner: None,
            durable: false,
        }
    }
}

/// Replaces `path` with `bytes`. The temporary file is created with O_EXCL (a link planted
/// under its name is never followed) and removed again on failure.
pub fn write_atomic(path: &Path, bytes: &[u8], new: NewFile) -> io::Result<()> {
    let temp = temp_path(path);
    let result = write_new(&temp, bytes, new).and_then(|file| {
        std::fs::rename(&temp, path)?;
        if new.durable {
            drop(file);
            File::open(parent(path))?.sync_all()?;
        }
        Ok(())
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

fn write_new(temp: &Path, bytes: &[u8], new: NewFile) -> io::Result<File> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(new.mode)
        .open(temp)?;
    file.set_permissions(Permissions::from_mode(new.mode))?;
    if let Some((uid, gid)) = new.owner {
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
    }
    file.write_all(bytes)?;
    if new.durable {
        file.sync_all()?;
    }
    Ok(file)
}

/// The directory holding `path` (`.` for a bare file name).
pub fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// A hidden name beside `path`, unique to this process.
fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.nvhook-{}.tmp", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn replaces_with_the_exact_mode_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("spec.json");
        std::fs::write(&file, "old").unwrap();
        write_atomic(&file, b"new", NewFile::mode(0o600)).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "new");
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o7777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_planted_link_at_the_temp_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.json");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, temp_path(&file)).unwrap();
        let durable = NewFile {
            durable: true,
            ..NewFile::mode(0o644)
        };
        assert!(write_atomic(&file, b"new", durable).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert!(!file.exists());
    }
}
