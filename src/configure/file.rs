//! Reading and replacing an engine's config file: atomic, with a backup, owner and mode
//! kept; and the diff shown by `--dry-run`.

use super::ConfigureError;
use crate::atomic_file::{self, NewFile};
use std::ffi::OsString;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A file created from nothing gets the mode engines' packages use for their configs.
const NEW_FILE_MODE: u32 = 0o644;

/// The file's text, or `None` when it does not exist.
pub(super) fn read(file: &Path) -> Result<Option<String>, ConfigureError> {
    match fs::read_to_string(file) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfigureError::Read {
            file: file.to_path_buf(),
            source,
        }),
    }
}

/// The containerd template k3s or RKE2 (`engine`) reads in `dir`: the one there, else the
/// one for the containerd whose config it last rendered (`config.toml`: version 3 is
/// containerd 2's).
pub(super) fn rancher_template(
    engine: super::Engine,
    dir: &str,
) -> Result<PathBuf, ConfigureError> {
    let dir = Path::new(dir);
    for name in [super::template::V3_NAME, super::template::V2_NAME] {
        if dir.join(name).exists() {
            return Ok(dir.join(name));
        }
    }
    match read(&dir.join("config.toml"))? {
        Some(rendered) => Ok(dir.join(super::template::name_for(&rendered))),
        None => Err(ConfigureError::NoRancherConfig {
            engine,
            dir: dir.to_path_buf(),
        }),
    }
}

/// Where the previous version of `file` is kept.
pub(super) fn backup_path(file: &Path) -> PathBuf {
    let mut name = OsString::from(file.as_os_str());
    name.push(".nvhook.bak");
    PathBuf::from(name)
}

/// Replaces `file` with `text` so that a reader (or a crash) sees the old file or the new
/// one, never half of it. Returns the backup made of the old file, if there was one.
pub(super) fn replace(
    file: &Path,
    text: &str,
    existed: bool,
) -> Result<Option<PathBuf>, ConfigureError> {
    let write_error = |source| ConfigureError::Write {
        file: file.to_path_buf(),
        source,
    };
    // A symlinked config (common for daemon.json) is edited where it points, not replaced.
    let target = if existed {
        fs::canonicalize(file).map_err(write_error)?
    } else {
        file.to_path_buf()
    };
    fs::create_dir_all(atomic_file::parent(&target)).map_err(write_error)?;
    let new = match existed {
        true => {
            let old = fs::metadata(&target).map_err(write_error)?;
            NewFile {
                mode: old.mode() & 0o7777,
                owner: Some((old.uid(), old.gid())),
                durable: true,
            }
        }
        false => NewFile {
            durable: true,
            ..NewFile::mode(NEW_FILE_MODE)
        },
    };
    let backup = match existed {
        true => {
            let backup = backup_path(&target);
            fs::copy(&target, &backup).map_err(write_error)?;
            Some(backup)
        }
        false => None,
    };
    atomic_file::write_atomic(&target, text.as_bytes(), new).map_err(write_error)?;
    Ok(backup)
}

/// Moves `file` to its backup path: the engine then runs as if it had never existed.
pub(super) fn retire(file: &Path) -> Result<PathBuf, ConfigureError> {
    let backup = backup_path(file);
    fs::rename(file, &backup).map_err(|source| ConfigureError::Write {
        file: file.to_path_buf(),
        source,
    })?;
    Ok(backup)
}

/// A unified diff from `old` to `new` (`None`: the file does not exist).
pub(super) fn unified_diff(file: &Path, old: Option<&str>, new: Option<&str>) -> String {
    let name = file.display().to_string();
    let label = |text: Option<&str>| match text {
        Some(_) => name.clone(),
        None => "/dev/null".to_string(),
    };
    let (a, b) = (label(old), label(new));
    similar::TextDiff::from_lines(old.unwrap_or(""), new.unwrap_or(""))
        .unified_diff()
        .context_radius(3)
        .header(&a, &b)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replace_keeps_mode_and_makes_a_backup() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("daemon.json");
        fs::write(&file, "old\n").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();

        let backup = replace(&file, "new\n", true).unwrap().unwrap();

        assert_eq!(fs::read_to_string(&file).unwrap(), "new\n");
        assert_eq!(fs::read_to_string(&backup).unwrap(), "old\n");
        let mode = fs::metadata(&file).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 2, "no temp file left behind");
    }

    #[test]
    fn replace_creates_the_directory_and_no_backup_for_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("crio.conf.d/99-nvidia.conf");

        assert_eq!(replace(&file, "x\n", false).unwrap(), None);

        assert_eq!(fs::read_to_string(&file).unwrap(), "x\n");
        assert!(!backup_path(&file).exists());
    }

    #[test]
    fn replace_writes_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.json");
        let link = dir.path().join("daemon.json");
        fs::write(&real, "old\n").unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();

        replace(&link, "new\n", true).unwrap();

        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_to_string(&real).unwrap(), "new\n");
    }

    #[test]
    fn k3s_template_is_the_one_there_else_the_one_for_its_containerd() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().to_str().unwrap();
        let e = rancher_template(super::super::Engine::K3s, at).unwrap_err();
        assert!(e.to_string().contains("start it once"), "{e}");
        fs::write(dir.path().join("config.toml"), "version = 3\n").unwrap();
        let v3 = dir.path().join("config-v3.toml.tmpl");
        assert_eq!(rancher_template(super::super::Engine::K3s, at).unwrap(), v3);
        fs::write(dir.path().join("config.toml"), "version = 2\n").unwrap();
        let v2 = dir.path().join("config.toml.tmpl");
        assert_eq!(rancher_template(super::super::Engine::K3s, at).unwrap(), v2);
        // An admin's template is used whatever k3s rendered last.
        fs::write(&v3, "{{ template \"base\" . }}\n").unwrap();
        assert_eq!(
            rancher_template(super::super::Engine::Rke2, at).unwrap(),
            v3
        );
    }

    #[test]
    fn diff_of_a_new_file_is_against_dev_null() {
        let diff = unified_diff(Path::new("/etc/x.conf"), None, Some("a = 1\n"));
        assert!(
            diff.starts_with("--- /dev/null\n+++ /etc/x.conf\n"),
            "{diff}"
        );
        assert!(diff.contains("+a = 1\n"), "{diff}");
    }
}
