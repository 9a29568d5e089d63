//! NVML's answer, cached between container starts.
//!
//! On a real GPU node NVML is the largest cost of a start (docs/performance.md has the
//! figures from an H100).
//! What NVML reports (GPUs, MIG devices, versions) changes only with the host: a reboot, a
//! driver reload or upgrade, a GPU bound or unbound, MIG reconfigured. Each of those shows
//! in files that cost microseconds to read, so the answer is stored with a fingerprint of
//! them and used again only while the fingerprint is the same.
//!
//! The file is root's: it is read only when owned by our effective user and writable by no
//! one else, from a directory that is the same, and never through a symlink.

use super::gpu_layout::GpuLayout;
use super::nvml::System;
use crate::config::Config;
use crate::file_id::FileId;
use crate::private_file::{self, private};
use crate::whole_file::read_kernel_text;
use serde::{Deserialize, Serialize};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The host state an NVML answer is valid for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// A new boot id: every kernel object NVML described is gone.
    boot_id: String,
    library: PathBuf,
    /// The NVML library file, and the directory it is in: a driver upgrade replaces the
    /// first and renames files in the second.
    library_file: FileId,
    library_dir: FileId,
    /// `<proc-root>/driver/nvidia/version`: a reloaded or different kernel module.
    module_version: Option<String>,
    /// Bus ids under `<proc-root>/driver/nvidia/gpus`: GPUs bound to or unbound from it.
    gpus: Vec<String>,
    /// Every path under `<proc-root>/driver/nvidia/capabilities`: MIG mode and the GPU and
    /// compute instances of each GPU.
    capabilities: Vec<String>,
}

impl Fingerprint {
    /// The host's state now, in this boot; None as for [`Fingerprint::read`].
    pub fn now(config: &Config, library: &Path) -> Option<Fingerprint> {
        Self::read(config, library, Path::new(BOOT_ID))
    }

    /// The NVML library it was taken for, canonical.
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// The host's state now, or None when part of it cannot be read (then nothing is kept).
    pub fn read(config: &Config, library: &Path, boot_id_file: &Path) -> Option<Fingerprint> {
        let library = std::fs::canonicalize(library).ok()?;
        let nvidia = config.proc_path("driver/nvidia");
        let layout = GpuLayout::read(config);
        Some(Fingerprint {
            boot_id: read_kernel_text(boot_id_file).ok()?.trim().to_owned(),
            library_file: FileId::of(&library)?,
            library_dir: FileId::of(library.parent()?)?,
            library,
            module_version: read_kernel_text(&nvidia.join("version")).ok(),
            gpus: layout.gpus,
            capabilities: layout.capabilities,
        })
    }
}

#[derive(Serialize, Deserialize)]
struct Stored {
    /// [`FORMAT`] when written; a file without it, or another number, was written by an
    /// nvhook whose answer lacks facts this one reports: a miss, like a changed host.
    format: u32,
    fingerprint: Fingerprint,
    system: System,
}

/// The layout of [`Stored`] and [`System`]; raised whenever what NVML's answer holds changes.
/// 3: MIG devices' profile, GPU instance profile id, placement and memory.
/// 4: the MIG profiles and placements of each MIG-enabled GPU.
/// 5: whether the driver can limit a container's GPU memory.
const FORMAT: u32 = 5;

/// The cache file, with the fingerprint of the host as it was before NVML was asked: state
/// that changes during the query makes the stored answer stale at once, never wrongly fresh.
pub struct NvmlCache {
    path: PathBuf,
    fingerprint: Fingerprint,
}

/// Where the kernel publishes this boot's random id.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

impl NvmlCache {
    /// None when the config turns the cache off or the host cannot be fingerprinted.
    pub fn open(config: &Config, library: &Path) -> Option<NvmlCache> {
        Self::open_with_boot_id(config, library, Path::new(BOOT_ID))
    }

    fn open_with_boot_id(config: &Config, library: &Path, boot_id: &Path) -> Option<NvmlCache> {
        let path = config.nvml_cache()?.to_path_buf();
        let fingerprint = Fingerprint::read(config, library, boot_id)?;
        Some(NvmlCache { path, fingerprint })
    }

    /// Drops the stored answer, for a change the fingerprint may not see: a MIG device made or
    /// removed shows as capability paths, but removing one and making another in its place
    /// gives back the same paths (a GPU instance's id names its placement, not its profile).
    pub fn forget(config: &Config) {
        let Some(path) = config.nvml_cache() else {
            return;
        };
        if let Err(e) = std::fs::remove_file(path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "stale NVML answer not removed");
        }
    }

    /// The stored answer, when it was stored for this very host state.
    pub fn read(&self) -> Option<System> {
        let stored = self.stored()?;
        (stored.fingerprint == self.fingerprint).then_some(stored.system)
    }

    /// The stored answer whatever host state it was stored for: what the host was before it
    /// changed, to tell the user what changed.
    pub fn previous(&self) -> Option<System> {
        self.stored().map(|s| s.system)
    }

    /// Why a file at the cache's path is not used, when one is there and is not (what
    /// [`NvmlCache::read`] turns down in silence); `None` where there is none, or it is used.
    pub fn unusable(&self) -> Option<String> {
        let dir = self.path.parent().unwrap_or(Path::new("/"));
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let meta = match std::fs::symlink_metadata(&self.path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            // Another user's private directory: whatever is stored there, this user cannot see.
            Err(e) => {
                return Some(format!(
                    "this user (uid {euid}) may not look into {}: {e}",
                    dir.display()
                ));
            }
        };
        if !std::fs::symlink_metadata(dir).is_ok_and(|m| private(&m)) {
            return Some(format!(
                "its directory {} is not private to this user (uid {euid}): a cache others may write is not trusted",
                dir.display()
            ));
        }
        if !private(&meta) {
            return Some(format!("it is not private to this user (uid {euid})"));
        }
        if let Err(e) = std::fs::File::open(&self.path) {
            return Some(format!("this user (uid {euid}) may not read it: {e}"));
        }
        self.stored()
            .is_none()
            .then(|| "it is not a cache this nvhook reads (the next start replaces it)".into())
    }

    fn stored(&self) -> Option<Stored> {
        let (bytes, _) = private_file::read(&self.path)?;
        crate::whole_file::json(&bytes).filter(|s: &Stored| s.format == FORMAT)
    }

    /// Stores `system` as the answer for the fingerprinted state. Best effort: a host where
    /// the file cannot be written (a read-only /run, a rootless hook) just queries NVML again.
    pub fn write(&self, system: &System) {
        let stored = Stored {
            format: FORMAT,
            fingerprint: self.fingerprint.clone(),
            system: system.clone(),
        };
        if let Err(e) = self.try_write(&stored) {
            tracing::debug!(path = %self.path.display(), error = %e, "NVML answer not cached");
        }
    }

    fn try_write(&self, stored: &Stored) -> std::io::Result<()> {
        private_file::write_json(&self.path, stored)
    }

    /// The cache's directory, made where missing, and only if it is private to this user.
    fn private_dir(&self) -> std::io::Result<()> {
        private_file::make_dir(self.path.parent().unwrap_or(Path::new("/")))
    }

    /// The lock that lets a burst of starts on a missing or stale cache share one NVML
    /// query: the first start to take it queries and stores the answer; the others wait
    /// here, then read that answer. The kernel releases it when its holder exits, so a
    /// holder that dies or hangs up never blocks anyone past `deadline`. `None` when it
    /// cannot be had by then, or at all (a read-only /run): the caller queries by itself.
    pub fn lock_query(&self, deadline: Instant) -> Option<QueryLock> {
        let opened = self.private_dir().and_then(|_| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(self.lock_path())
        });
        let file = match opened {
            Ok(file) => file,
            Err(e) => {
                tracing::debug!(error = %e, "no NVML query lock: querying alone");
                return None;
            }
        };
        loop {
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Some(QueryLock { _held: file });
            }
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::WouldBlock || Instant::now() >= deadline {
                tracing::debug!(%error, "NVML query lock not had: querying alone");
                return None;
            }
            std::thread::sleep(LOCK_POLL);
        }
    }

    fn lock_path(&self) -> PathBuf {
        let mut name = self.path.file_name().unwrap_or_default().to_owned();
        name.push(".lock");
        self.path.with_file_name(name)
    }
}

/// How often a waiting start looks at the query lock: a small part of any NVML query.
const LOCK_POLL: Duration = Duration::from_millis(2);

/// Held while this process asks NVML for the starts waiting on [`NvmlCache::lock_query`];
/// closing the file releases it.
pub struct QueryLock {
    _held: std::fs::File,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A driver root with an NVML library, a proc root with one GPU, and a boot id.
    struct Host {
        dir: tempfile::TempDir,
        config: Config,
    }

    impl Host {
        fn new() -> Host {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path();
            std::fs::create_dir_all(root.join("lib")).unwrap();
            std::fs::write(root.join("lib/libnvidia-ml.so.1"), b"nvml").unwrap();
            std::fs::write(root.join("boot_id"), "b1\n").unwrap();
            let nvidia = root.join("proc/driver/nvidia");
            std::fs::create_dir_all(nvidia.join("gpus/0000:01:00.0")).unwrap();
            std::fs::write(nvidia.join("version"), "NVRM version: 580.159.04\n").unwrap();
            let config = Config {
                proc_root: root.join("proc"),
                nvml_cache_file: root.join("run/nvhook/nvml.json"),
                ..Config::default()
            };
            Host { dir, config }
        }

        fn path(&self, rel: &str) -> PathBuf {
            self.dir.path().join(rel)
        }

        fn cache(&self) -> NvmlCache {
            let library = self.path("lib/libnvidia-ml.so.1");
            NvmlCache::open_with_boot_id(&self.config, &library, &self.path("boot_id")).unwrap()
        }
    }

    /// A change to the host, named.
    type Change = fn(&Host);

    #[test]
    fn one_start_at_a_time_holds_the_query_lock_and_its_end_frees_it() {
        let host = Host::new();
        let soon = || Instant::now() + Duration::from_millis(30);
        let held = host
            .cache()
            .lock_query(soon())
            .expect("a free lock is taken");
        let waited = Instant::now();
        assert!(
            host.cache().lock_query(soon()).is_none(),
            "held by another start"
        );
        assert!(
            waited.elapsed() >= Duration::from_millis(30),
            "waited until its deadline"
        );
        drop(held);
        assert!(host.cache().lock_query(soon()).is_some(), "free again");
    }

    fn system() -> System {
        System {
            driver_version: "580.159.04".into(),
            cuda_version: "13.0".into(),
            gpus: Vec::new(),
            memory_limits: false,
        }
    }

    #[test]
    fn an_answer_is_used_again_while_the_host_is_the_same() {
        let host = Host::new();
        assert!(host.cache().read().is_none(), "nothing stored yet");
        host.cache().write(&system());
        let read = host.cache().read().expect("stored answer");
        assert_eq!(read.driver_version, "580.159.04");
        let dir = std::fs::metadata(host.path("run/nvhook")).unwrap();
        assert_eq!(dir.mode() & 0o777, 0o700);
        let file = std::fs::metadata(host.path("run/nvhook/nvml.json")).unwrap();
        assert_eq!(file.mode() & 0o777, 0o600);
    }

    #[test]
    fn an_answer_an_older_nvhook_stored_is_a_miss() {
        let host = Host::new();
        host.cache().write(&system());
        let file = host.path("run/nvhook/nvml.json");
        let mut stored: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        stored.as_object_mut().unwrap().remove("format");
        std::fs::write(&file, stored.to_string()).unwrap();
        assert!(host.cache().read().is_none(), "no format: stale");
        stored["format"] = serde_json::json!(FORMAT - 1);
        std::fs::write(&file, stored.to_string()).unwrap();
        assert!(host.cache().read().is_none(), "older format: stale");
        assert!(host.cache().previous().is_none());
    }

    #[test]
    fn any_change_of_the_host_makes_it_stale() {
        let changes: [(&str, Change); 6] = [
            ("reboot", |h| {
                std::fs::write(h.path("boot_id"), "b2\n").unwrap()
            }),
            ("driver library replaced", |h| {
                let lib = h.path("lib/libnvidia-ml.so.1");
                std::fs::remove_file(&lib).unwrap();
                std::fs::write(&lib, b"nvml 2").unwrap();
            }),
            ("module reloaded", |h| {
                let version = h.path("proc/driver/nvidia/version");
                std::fs::write(version, "NVRM version: 580.160.01\n").unwrap();
            }),
            ("GPU bound", |h| {
                std::fs::create_dir(h.path("proc/driver/nvidia/gpus/0000:02:00.0")).unwrap();
            }),
            ("GPU unbound", |h| {
                std::fs::remove_dir(h.path("proc/driver/nvidia/gpus/0000:01:00.0")).unwrap();
            }),
            ("MIG reconfigured", |h| {
                let ci = h.path("proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0");
                std::fs::create_dir_all(ci).unwrap();
            }),
        ];
        for (what, change) in changes {
            let host = Host::new();
            host.cache().write(&system());
            change(&host);
            assert!(host.cache().read().is_none(), "{what}: stale answer used");
        }
    }

    #[test]
    fn a_file_others_could_have_written_is_not_read() {
        use std::os::unix::fs::PermissionsExt;
        let host = Host::new();
        host.cache().write(&system());
        let file = host.path("run/nvhook/nvml.json");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(host.cache().read().is_none());
        // A symlink in its place is not followed.
        std::fs::remove_file(&file).unwrap();
        std::fs::write(host.path("elsewhere.json"), b"{}").unwrap();
        std::os::unix::fs::symlink(host.path("elsewhere.json"), &file).unwrap();
        assert!(host.cache().read().is_none());
    }

    #[test]
    fn a_forgotten_answer_is_asked_again() {
        let host = Host::new();
        host.cache().write(&system());
        NvmlCache::forget(&host.config);
        assert!(host.cache().read().is_none());
        NvmlCache::forget(&host.config);
    }

    #[test]
    fn an_empty_path_turns_the_cache_off() {
        let host = Host::new();
        let config = Config {
            nvml_cache_file: PathBuf::new(),
            ..host.config.clone()
        };
        let library = host.path("lib/libnvidia-ml.so.1");
        assert!(NvmlCache::open(&config, &library).is_none());
    }
}
