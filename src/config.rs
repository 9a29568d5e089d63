//! nvhook's config file read from disk. What it holds, its defaults and its checks are the
//! model's ([`nvhook_model::config`]).

pub use nvhook_model::config::*;

use crate::file_id::{FileId, SETTLED};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Loads the config named explicitly, else `$NVHOOK_CONFIG`, else the default path.
/// Only the default path may be absent (then the defaults apply).
pub fn load(explicit: Option<&Path>, env_value: Option<&str>) -> Result<Config, ConfigError> {
    let named = explicit
        .map(Path::to_path_buf)
        .or_else(|| env_value.filter(|v| !v.is_empty()).map(PathBuf::from));
    match named {
        Some(path) => from_file(&path),
        None => match std::fs::read_to_string(DEFAULT_PATH) {
            Ok(text) => Config::parse(&text, Path::new(DEFAULT_PATH)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(source) => Err(ConfigError::Read {
                path: DEFAULT_PATH.into(),
                source,
            }),
        },
    }
}

/// The config of a process that serves many containers (the NRI plugin), read as [`load`]
/// reads it, again only when its file changed: it reads its config for every container, so
/// that a policy change applies to the next one.
#[derive(Debug, Default)]
pub struct Kept(Option<(PathBuf, FileId, Config)>);

impl Kept {
    /// [`load`] of `explicit` (no `$NVHOOK_CONFIG`): the config kept from a read before while
    /// its file is the same one, unchanged; a file that changed less than [`SETTLED`] ago is
    /// read every time.
    pub fn load(&mut self, explicit: Option<&Path>) -> Result<Config, ConfigError> {
        self.load_at(explicit, SystemTime::now())
    }

    /// [`Kept::load`] at time `now`.
    fn load_at(&mut self, explicit: Option<&Path>, now: SystemTime) -> Result<Config, ConfigError> {
        let path = explicit.unwrap_or(Path::new(DEFAULT_PATH));
        // Taken before the read: a change in between leaves a kept identity older than the
        // file, which costs one more read, never a stale config.
        let id = FileId::of(path);
        if let (Some(id), Some((kept_path, kept_id, config))) = (&id, &self.0)
            && kept_path == path
            && kept_id == id
        {
            return Ok(config.clone());
        }
        let config = load(explicit, None)?;
        self.0 = id
            .filter(|id| !id.changed_lately(now, SETTLED))
            .map(|id| (path.to_path_buf(), id, config.clone()));
        Ok(config)
    }
}

pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Config::parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_config_is_read_again_once_its_file_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let level = |config: Config| config.log_level;
        // Seen from a while after each write below: settled.
        let later = || SystemTime::now() + std::time::Duration::from_secs(60);
        let mut kept = Kept::default();
        std::fs::write(&path, "log-level = \"debug\"\n").unwrap();
        let first = kept.load_at(Some(&path), later()).unwrap();
        assert_eq!(level(first.clone()), LogLevel::Debug);
        assert!(kept.0.is_some(), "a settled file's config is kept");
        assert_eq!(kept.load_at(Some(&path), later()).unwrap(), first);
        // Rewritten: another identity, read again.
        std::fs::write(&path, "log-level = \"warn\"\n").unwrap();
        assert_eq!(
            level(kept.load_at(Some(&path), later()).unwrap()),
            LogLevel::Warn
        );
        // Replaced by a rename, as editors and config management do.
        let new = dir.path().join("new.toml");
        std::fs::write(&new, "log-level = \"error\"\n").unwrap();
        std::fs::rename(&new, &path).unwrap();
        assert_eq!(
            level(kept.load_at(Some(&path), later()).unwrap()),
            LogLevel::Error
        );
        // Changed just now: read, and not kept, for a change within the clock's granularity
        // could leave its times as they are.
        std::fs::write(&path, "log-level = \"info\"\n").unwrap();
        let now = kept.load_at(Some(&path), SystemTime::now()).unwrap();
        assert_eq!(level(now), LogLevel::Info);
        assert!(kept.0.is_none());
        // Another path is another config; a named file that is missing fails, as `load` does.
        let other = dir.path().join("other.toml");
        std::fs::write(&other, "log-level = \"debug\"\n").unwrap();
        assert_eq!(
            level(kept.load_at(Some(&other), later()).unwrap()),
            LogLevel::Debug
        );
        let missing = dir.path().join("missing.toml");
        assert!(matches!(
            kept.load_at(Some(&missing), later()),
            Err(ConfigError::Read { .. })
        ));
        // A config that does not parse is an error each time, never a kept config.
        std::fs::write(&path, "log-level = 3\n").unwrap();
        assert!(kept.load_at(Some(&path), later()).is_err());
        assert_eq!(
            load(Some(&path), None).unwrap_err().to_string(),
            kept.load_at(Some(&path), later()).unwrap_err().to_string()
        );
    }

    #[test]
    fn documented_file_parses_to_the_defaults() {
        let text = include_str!("../config/config.toml");
        let parsed = Config::parse(text, Path::new(DEFAULT_PATH)).unwrap();
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn explicit_missing_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent/nvhook.toml");
        let e = load(Some(&absent), None).unwrap_err();
        assert!(e.to_string().contains(absent.to_str().unwrap()));
    }
}
