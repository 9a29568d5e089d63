//! The config as parsed, kept between the processes that work on one container each (the
//! hooks, nvhook-runtime's create). Each of them reads the config before anything else, and
//! the TOML parser's code running for the first time in a new process costs more than the
//! same settings read back as JSON, whose parser the start runs anyway.
//!
//! A kept config is used only by the very program that kept it (its file's identity), for the
//! same config path whose file has the same identity, and only from a root-private file
//! ([`crate::private_file`]). A config that changed lately is read each time and not kept: a
//! change within the filesystem clock's granularity could leave its times as they were.

use crate::config::{self, Config, ConfigError};
use crate::file_id::{FileId, SETTLED};
use serde::{Deserialize, Serialize};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// On tmpfs, so that a reboot forgets them; one file per config path.
pub const DIR: &str = "/run/nvhook/config";

/// Most configs kept: a node has one or two; tests and benches name many.
const MOST: usize = 32;

/// What is kept: `config` is a [`Config`] when read, and only the settings that differ from the
/// program's defaults when written (the same program reads it back, with the same defaults).
#[derive(Serialize, Deserialize)]
struct Stored<C> {
    path: PathBuf,
    file: FileId,
    program: FileId,
    config: C,
}

/// [`config::load`] of `explicit` (no `$NVHOOK_CONFIG`), through the configs kept in [`DIR`].
pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
    load_in(Path::new(DIR), explicit, SystemTime::now())
}

fn load_in(dir: &Path, explicit: Option<&Path>, now: SystemTime) -> Result<Config, ConfigError> {
    let path = explicit.unwrap_or(Path::new(config::DEFAULT_PATH));
    // Taken before the read: a change in between leaves a kept identity older than the file,
    // which costs one more parse, never a stale config.
    let (Some(file), Some(program)) = (FileId::of(path), FileId::of(Path::new("/proc/self/exe")))
    else {
        return config::load(explicit, None);
    };
    let kept = dir.join(name(path));
    if let Some(config) = read(&kept, path, &file, &program) {
        return Ok(config);
    }
    let config = config::load(explicit, None)?;
    let settled = !file.changed_lately(now, SETTLED) && !program.changed_lately(now, SETTLED);
    // Nothing is logged yet (the config says where): a config not kept is parsed again by the
    // next process, which is all it costs. serde_json would refuse only a path that is not
    // UTF-8, which TOML cannot give.
    if let Some(set) = settled.then(|| set_apart_from_defaults(&config)).flatten() {
        let stored = Stored {
            path: path.to_path_buf(),
            file,
            program,
            config: set,
        };
        if crate::private_file::write_json(&kept, &stored).is_ok() {
            prune(dir, &kept);
        }
    }
    Ok(config)
}

/// `config`'s settings whose values are not the defaults': the fewer, the less a start parses.
fn set_apart_from_defaults(config: &Config) -> Option<serde_json::Value> {
    let serde_json::Value::Object(defaults) = serde_json::to_value(Config::default()).ok()? else {
        return None;
    };
    let mut set = serde_json::to_value(config).ok()?;
    set.as_object_mut()?
        .retain(|key, value| defaults.get(key) != Some(value));
    Some(set)
}

/// The kept file's name for the config at `path`.
fn name(path: &Path) -> String {
    let hash = nvhook_model::stable_hash::fnv1a(path.as_os_str().as_bytes().iter().copied());
    format!("{hash:016x}.json")
}

/// The config kept at `kept` for the file at `path` with identity `file`, by `program`.
fn read(kept: &Path, path: &Path, file: &FileId, program: &FileId) -> Option<Config> {
    let (bytes, _) = crate::private_file::read(kept)?;
    let stored: Stored<Config> = crate::whole_file::json(&bytes)?;
    (stored.path == path && &stored.file == file && &stored.program == program)
        .then_some(stored.config)
        .filter(|c| c.validate().is_ok())
}

/// Removes the least lately kept configs beyond [`MOST`], never `just_kept`.
fn prune(dir: &Path, just_kept: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let others: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|path| path != just_kept)
        .collect();
    // Their times only when some must go: a node keeps one or two.
    if others.len() < MOST {
        return;
    }
    let mut others: Vec<(SystemTime, PathBuf)> = others
        .into_iter()
        .filter_map(|path| Some((std::fs::metadata(&path).ok()?.modified().ok()?, path)))
        .collect();
    others.sort();
    // With the one just kept, MOST are left.
    let excess = (others.len() + 1).saturating_sub(MOST);
    for (_, path) in &others[..excess] {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LogLevel;
    use std::os::unix::fs::PermissionsExt;

    /// Seen from a while after each write: settled.
    fn later() -> SystemTime {
        SystemTime::now() + std::time::Duration::from_secs(60)
    }

    fn stored(kept: &Path) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(kept).unwrap()).unwrap()
    }

    #[test]
    fn a_settled_config_is_kept_and_read_back_until_its_file_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kept");
        let path = tmp.path().join("config.toml");
        let level = |c: Config| c.log_level;
        std::fs::write(&path, "log-level = \"debug\"\n").unwrap();
        // Changed just now: parsed, not kept.
        let now = load_in(&dir, Some(&path), SystemTime::now()).unwrap();
        assert_eq!(level(now), LogLevel::Debug);
        let kept = dir.join(name(&path));
        assert!(!kept.exists());
        // Settled: kept, private to root's nvhook.
        let first = load_in(&dir, Some(&path), later()).unwrap();
        assert_eq!(first, config::load(Some(&path), None).unwrap());
        let mode = std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Only what differs from the defaults, which the same program reads back.
        assert_eq!(
            stored(&kept)["config"],
            serde_json::json!({"log-level": "debug"})
        );
        // The next process reads what was kept, not the TOML: a kept file saying otherwise
        // (written here, as no process would) is what it gets.
        let mut edited = stored(&kept);
        edited["config"]["log-level"] = "error".into();
        std::fs::write(&kept, serde_json::to_vec(&edited).unwrap()).unwrap();
        assert_eq!(
            level(load_in(&dir, Some(&path), later()).unwrap()),
            LogLevel::Error
        );
        // The file rewritten: another identity, parsed again and kept anew.
        std::fs::write(&path, "log-level = \"warn\"\n").unwrap();
        assert_eq!(
            level(load_in(&dir, Some(&path), later()).unwrap()),
            LogLevel::Warn
        );
        assert_eq!(stored(&kept)["config"]["log-level"], "warn");
        // Replaced by a rename, as editors and config management do.
        let new = tmp.path().join("new.toml");
        std::fs::write(&new, "log-level = \"error\"\n").unwrap();
        std::fs::rename(&new, &path).unwrap();
        assert_eq!(
            level(load_in(&dir, Some(&path), later()).unwrap()),
            LogLevel::Error
        );
    }

    #[test]
    fn a_kept_config_of_another_program_path_or_owner_is_not_used() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kept");
        let path = tmp.path().join("config.toml");
        std::fs::write(&path, "log-level = \"debug\"\n").unwrap();
        load_in(&dir, Some(&path), later()).unwrap();
        let kept = dir.join(name(&path));
        let original = stored(&kept);
        let mut tampered = original.clone();
        tampered["config"]["log-level"] = "error".into();
        let with = |change: &dyn Fn(&mut serde_json::Value)| {
            let mut value = tampered.clone();
            change(&mut value);
            std::fs::write(&kept, serde_json::to_vec(&value).unwrap()).unwrap();
            load_in(&dir, Some(&path), SystemTime::now())
                .unwrap()
                .log_level
        };
        // Another build of nvhook (its defaults and checks may differ), or another path.
        assert_eq!(
            with(&|v| v["program"] = original["file"].clone()),
            LogLevel::Debug
        );
        assert_eq!(
            with(&|v| v["path"] = "/etc/other.toml".into()),
            LogLevel::Debug
        );
        // A kept config that its checks refuse.
        assert_eq!(
            with(&|v| v["config"]["runtimes"] = serde_json::json!([])),
            LogLevel::Debug
        );
        // Writable by others.
        with(&|_| {});
        std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(
            load_in(&dir, Some(&path), SystemTime::now())
                .unwrap()
                .log_level,
            LogLevel::Debug
        );
        // Untouched, it is used.
        std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(with(&|_| {}), LogLevel::Error);
    }

    #[test]
    fn errors_are_the_configs_own_and_nothing_is_kept_for_them() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kept");
        let missing = tmp.path().join("missing.toml");
        let err = load_in(&dir, Some(&missing), later()).unwrap_err();
        assert_eq!(
            err.to_string(),
            config::load(Some(&missing), None).unwrap_err().to_string()
        );
        let bad = tmp.path().join("bad.toml");
        std::fs::write(&bad, "log-level = 3\n").unwrap();
        let err = load_in(&dir, Some(&bad), later()).unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
        assert!(!dir.exists());
    }

    #[test]
    fn at_most_the_latest_configs_are_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kept");
        let paths: Vec<PathBuf> = (0..MOST + 3)
            .map(|i| tmp.path().join(format!("config-{i}.toml")))
            .collect();
        for path in &paths {
            std::fs::write(path, "").unwrap();
            load_in(&dir, Some(path), later()).unwrap();
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), MOST);
        let last = paths.last().unwrap();
        assert!(dir.join(name(last)).exists());
    }
}
