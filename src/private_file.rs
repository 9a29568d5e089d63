//! Files that only root's nvhook processes write and read: NVML's cached answer, the NRI
//! plugin's inventory for a container's hook. A hook trusts what it reads there as its own
//! work, so a file is read only when it and its directory are owned by our effective user and
//! writable by no one else, and never through a symlink.

use crate::atomic_file::{NewFile, write_atomic};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Owned by our effective user, not a symlink, and writable by no one else.
pub fn private(meta: &std::fs::Metadata) -> bool {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    !meta.file_type().is_symlink() && meta.uid() == euid && meta.mode() & 0o022 == 0
}

/// `dir`, made (0700) where missing, and only if it is private to this user.
pub fn make_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    if !private(&std::fs::symlink_metadata(dir)?) {
        return Err(std::io::Error::other(format!(
            "{} is not private to this user",
            dir.display()
        )));
    }
    Ok(())
}

/// Replaces `path` with `value` as JSON, private to this user (0600), in its directory made
/// private where missing.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    make_dir(crate::atomic_file::parent(path))?;
    write_atomic(path, &bytes, NewFile::mode(0o600))
}

/// The contents of `path` with its metadata, when it and its directory are private to this
/// user; `None` otherwise (a file others could have written is as good as absent).
pub fn read(path: &Path) -> Option<(Vec<u8>, std::fs::Metadata)> {
    let dir = path.parent()?;
    if !private(&std::fs::symlink_metadata(dir).ok()?) {
        return None;
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !private(&meta) {
        tracing::warn!(path = %path.display(), "not private to this user: not used");
        return None;
    }
    let bytes = crate::whole_file::read_sized(&mut file, meta.len()).ok()?;
    Some((bytes, meta))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_files_private_to_this_user_in_a_private_directory_are_read() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        make_dir(&dir).unwrap();
        let file = dir.join("answer.json");
        std::fs::write(&file, b"{}").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&file).map(|(b, _)| b), Some(b"{}".to_vec()));
        // Writable by others: refused.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o622)).unwrap();
        assert_eq!(read(&file).map(|(b, _)| b), None);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Through a symlink: refused.
        let link = dir.join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read(&link).map(|(b, _)| b), None);
        // In a directory others may write: refused, and not taken as one to write in.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(read(&file).map(|(b, _)| b), None);
        assert!(make_dir(&dir).is_err());
    }
}
