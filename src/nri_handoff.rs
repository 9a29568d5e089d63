//! The inventory the NRI plugin planned a container with, left for that container's prestart
//! hook (`nri-mode = "hook"`), so that the hook does not find the driver's files and read
//! NVML's answer again a few milliseconds later. The plugin cannot hand over its plan: it plans
//! for any image before the image is mounted, and the hook plans for the image it finds.
//!
//! A file per container id, beside NVML's cached answer and as private: the hook takes it
//! (reads and removes it) and uses it only while the host is in the state it was found in
//! (NVML's fingerprint) and for a short while; otherwise it reads the inventory itself, as
//! without the plugin. The plugin removes the file of a container removed before it started.

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
const MAX_AGE: Duration = Duration::from_secs(60);

#[derive(serde::Serialize, serde::Deserialize)]
struct Handed {
    /// The host state the inventory was found in.
    fingerprint: Fingerprint,
    /// Whether the graphics files were looked for ([`Scope::graphics`]).
    graphics: bool,
    inventory: Inventory,
}

/// The file for container `id`: none where NVML's answer is not cached (the config turns the
/// cache off, and with it every file kept between processes), or for an id that is no plain
/// file name.
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
    Some(
        config
            .nvml_cache()?
            .parent()?
            .join(DIR)
            .join(format!("{id}.json")),
    )
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
    let handed: Handed = serde_json::from_slice(&bytes).ok()?;
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
