//! The inventory the NRI plugin planned a container with, left for that container's prestart
//! hook (`nri-mode = "hook"`), so that the hook does not find the driver's files and read
//! NVML's answer again a few milliseconds later. The plugin cannot hand over its plan: it plans
//! for any image before the image is mounted, and the hook plans for the image it finds.
//!
//! A file per container id, beside NVML's cached answer and as private: the hook takes it
//! (reads and removes it) and uses it only while the host is in the state it was found in
//! (NVML's fingerprint) and for a short while; otherwise it reads the inventory itself, as
//! without the plugin. The plugin removes the file of a container removed before it started,
//! and, when it connects and once a while after, every file too old to be used: those of
//! containers removed while it was not connected, or never started.

use crate::config::Config;
use crate::inventory::cache::Fingerprint;
use crate::inventory::{Inventory, Scope};
use crate::private_file;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// The directory beside NVML's cached answer.
const DIR: &str = "nri-inventory";

/// How long after the plugin's planning the hook still uses its inventory. A kubelet starts a
/// container right after creating it; one started later reads the host as it is then.
pub const MAX_AGE: Duration = Duration::from_secs(60);

#[derive(serde::Serialize, serde::Deserialize)]
struct Handed {
    /// The host state the inventory was found in.
    fingerprint: Fingerprint,
    /// Whether the graphics files were looked for ([`Scope::graphics`]).
    graphics: bool,
    inventory: Inventory,
}

/// The files' directory: none where NVML's answer is not cached (the config turns the cache
/// off, and with it every file kept between processes).
fn dir(config: &Config) -> Option<PathBuf> {
    Some(config.nvml_cache()?.parent()?.join(DIR))
}

/// The file for container `id`: none without [`dir`], or for an id that is no plain file name.
fn path(config: &Config, id: &str) -> Option<PathBuf> {
    let plain = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !plain {
        return None;
    }
    Some(dir(config)?.join(format!("{id}.json")))
}

/// Leaves `inventory`, found for `scope` with the host in state `fingerprint`, for the hook
/// of container `id`. Best effort: without it the hook reads the inventory itself.
pub fn leave(
    config: &Config,
    id: &str,
    fingerprint: Fingerprint,
    scope: Scope,
    inventory: Inventory,
) {
    let Some(path) = path(config, id) else {
        return;
    };
    let handed = Handed {
        fingerprint,
        graphics: scope.graphics,
        inventory,
    };
    if let Err(e) = private_file::write_json(&path, &handed) {
        tracing::debug!(path = %path.display(), error = %e, "NRI: inventory not left for the hook");
    }
}

/// The inventory the plugin left for container `id`, when it covers `scope` and the host is
/// still as it was found. The file is removed whether it is used or not: it was for this
/// start alone.
pub fn take(config: &Config, id: &str, scope: Scope) -> Option<Inventory> {
    let path = path(config, id)?;
    let (bytes, meta) = private_file::read(&path)?;
    if let Err(e) = std::fs::remove_file(&path) {
        tracing::debug!(path = %path.display(), error = %e, "NRI plugin's inventory not removed");
    }
    let age = meta
        .modified()
        .ok()
        .and_then(|at| SystemTime::now().duration_since(at).ok());
    if age.is_none_or(|age| age > MAX_AGE) {
        tracing::info!(
            ?age,
            "the NRI plugin's inventory is too old for this start: not used"
        );
        return None;
    }
    let handed: Handed = crate::whole_file::json(&bytes)?;
    if scope.graphics && !handed.graphics {
        return None;
    }
    // The library the plugin found through the driver's loader cache: one the cache no
    // longer leads to was replaced, or its directory changed, which the fingerprint sees.
    let now = Fingerprint::now(config, handed.fingerprint.library());
    if now.as_ref() != Some(&handed.fingerprint) {
        tracing::info!(
            "the host changed since the NRI plugin planned: reading the inventory again"
        );
        return None;
    }
    Some(handed.inventory)
}

/// Removes what was left for container `id`: it was removed without starting.
pub fn discard(config: &Config, id: &str) {
    if let Some(path) = path(config, id)
        && let Err(e) = std::fs::remove_file(&path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::debug!(path = %path.display(), error = %e, "NRI plugin's inventory not removed");
    }
}

/// Removes every file left that [`take`] would refuse for its age, and says how many it
/// removed. Best effort, like leaving them: a file it cannot remove is refused all the same.
pub fn sweep(config: &Config) -> usize {
    sweep_at(config, SystemTime::now())
}

/// [`sweep`] at time `now`.
fn sweep_at(config: &Config, now: SystemTime) -> usize {
    let Some(entries) = dir(config).and_then(|dir| std::fs::read_dir(dir).ok()) else {
        return 0;
    };
    let too_old = |entry: &std::fs::DirEntry| {
        // The entry itself, not what a link there leads to.
        let Ok(meta) = entry.metadata() else {
            return false;
        };
        let age = meta
            .modified()
            .ok()
            .and_then(|at| now.duration_since(at).ok());
        meta.is_file()
            && entry.file_name().to_string_lossy().ends_with(".json")
            && age.is_some_and(|age| age > MAX_AGE)
    };
    entries
        .flatten()
        .filter(too_old)
        .filter(|entry| std::fs::remove_file(entry.path()).is_ok())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_removes_only_the_files_too_old_to_be_taken() {
        let state = tempfile::tempdir().unwrap();
        let config = Config {
            nvml_cache_file: state.path().join("nvml-inventory.json"),
            ..Config::default()
        };
        assert_eq!(sweep(&config), 0, "no directory yet");
        let dir = dir(&config).unwrap();
        std::fs::create_dir(&dir).unwrap();
        let now = SystemTime::now();
        let file = |name: &str, age: Duration| {
            let path = dir.join(name);
            std::fs::write(&path, b"{}").unwrap();
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(now - age).unwrap();
            path
        };
        let young = file("young.json", MAX_AGE - Duration::from_secs(5));
        let old = file("old.json", MAX_AGE + Duration::from_secs(5));
        let other = file("old.txt", MAX_AGE * 10);
        let kept_dir = dir.join("sub.json");
        std::fs::create_dir(&kept_dir).unwrap();
        assert_eq!(sweep_at(&config, now), 1);
        assert!(young.exists() && other.exists() && kept_dir.exists());
        assert!(!old.exists());
        // Without NVML's cache there is no directory to sweep.
        let uncached = Config {
            nvml_cache_file: "".into(),
            ..Config::default()
        };
        assert_eq!(sweep_at(&uncached, now + MAX_AGE * 10), 0);
        assert!(young.exists());
    }
}
