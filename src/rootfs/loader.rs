//! The container's loader cache, updated by nvhook itself: the image's ldconfig is never run
//! (it is image code, and it followed symlinks out of crafted images: CVE-2025-23267).

use super::{Existing, Rootfs, RootfsError};
use crate::plan::{CacheEntry, LdSoConf, Symlink};
use nvhook_ldcache::{Arch, Entry, LdCache, MAX_CACHE_LEN};

pub(crate) const CACHE_PATH: &str = "/etc/ld.so.cache";

/// Creates `symlinks`, then, when the image has a loader cache, adds `entries` (libraries of
/// `arch`) to it, each in place of the image's same-named ones, and `ahead` before them,
/// keeping them (a cache with nothing to add is left as it is), and writes `confs`. Shared by
/// the prestart hook and the CDI route's hook.
pub fn link_and_cache(
    rootfs: &Rootfs,
    symlinks: &[Symlink],
    arch: Arch,
    (entries, ahead): (&[CacheEntry], &[CacheEntry]),
    confs: &[LdSoConf],
    image_has_cache: bool,
) -> Result<(), RootfsError> {
    for link in symlinks {
        if rootfs.make_symlink(&link.path, &link.target)? == Existing::Replaced {
            tracing::info!(path = %link.path, "replaced the image's own entry with a link");
        }
    }
    if image_has_cache {
        let n = if entries.is_empty() && ahead.is_empty() {
            0
        } else {
            update_cache(rootfs, arch, entries, ahead)?
        };
        for conf in confs {
            match write_conf(rootfs, conf) {
                // The cache just written is what the loader reads; the file only tells an
                // ldconfig run in the image where the libraries are. A pod that mounts its own
                // /etc/ld.so.conf.d (a ConfigMap) starts without it.
                Err(e @ RootfsError::Volume { .. }) => {
                    tracing::info!(path = %conf.path, "not written: {e}");
                }
                written => written?,
            }
        }
        tracing::debug!(entries = n, "loader cache written");
    }
    Ok(())
}

/// Adds `entries` (flagged as `arch`'s libraries) to the image's /etc/ld.so.cache, replacing
/// same-name entries, then `ahead` before same-name entries, and writes it back atomically. A cache that does not parse is rebuilt
/// from the entries alone: glibc then finds the image's own libraries in its default
/// directories.
pub fn update_cache(
    rootfs: &Rootfs,
    arch: Arch,
    entries: &[CacheEntry],
    ahead: &[CacheEntry],
) -> Result<usize, RootfsError> {
    let mut cache = match rootfs.read_file(CACHE_PATH, MAX_CACHE_LEN)? {
        Some(bytes) => LdCache::parse(&bytes).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the image's {CACHE_PATH} does not parse; writing a new one");
            LdCache::default()
        }),
        None => LdCache::default(),
    };
    for e in entries {
        cache.insert(Entry::new(e.soname.clone(), e.path.clone(), arch, e.class));
    }
    for e in ahead {
        cache.insert_ahead(Entry::new(e.soname.clone(), e.path.clone(), arch, e.class));
    }
    let bytes = cache.to_bytes().map_err(|e| RootfsError::Op {
        op: "encode",
        path: CACHE_PATH.into(),
        message: e.to_string(),
    })?;
    rootfs.replace_file(CACHE_PATH, &bytes, 0o644)?;
    Ok(cache.entries().len())
}

/// Keeps the injected library directories known to a later ldconfig run inside the image.
pub fn write_conf(rootfs: &Rootfs, conf: &LdSoConf) -> Result<(), RootfsError> {
    let mut text = String::from("# Written by nvhook: NVIDIA driver libraries.\n");
    for d in &conf.dirs {
        text.push_str(d);
        text.push('\n');
    }
    rootfs.replace_file(&conf.path, text.as_bytes(), 0o644)
}
