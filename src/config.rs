//! nvhook's config file read from disk. What it holds, its defaults and its checks are the
//! model's ([`nvhook_model::config`]).

pub use nvhook_model::config::*;

use std::path::{Path, PathBuf};

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
