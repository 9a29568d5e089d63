//! Loading the inventory with NVML queried in another process.
//!
//! A real libnvidia-ml may start threads, and setns(CLONE_NEWNS) refuses a process whose
//! fs struct is shared with other threads; NVML can also hang for seconds without
//! persistence mode. A child process keeps the hook single-threaded and bounds NVML's time;
//! it is a program of its own ([`HELPER`]) because nvhook is static.
//!
//! The child answers before NVML is shut down, and the parent does not wait for it to exit:
//! nvmlShutdown, or the driver's clean-up when the process exits without it, is time the
//! container start need not pay (docs/performance.md). Unless the parent is its PID
//! namespace's first process, which would inherit the child (see `query_in_child`).

use super::cache::{Fingerprint, NvmlCache};
use super::change::HostChange;
use super::driver::HostCache;
use super::kept_files::{self, Kept};
use super::nvml::{Reply, System};
use super::{Inventory, InventoryError, Scope, nvml_library};
use crate::config::Config;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where the NVML part of an inventory came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// NVML's answer cached by an earlier start, for the same host state.
    Cache,
    /// NVML asked now; `change` is how its answer differs from the one stored for the host
    /// as it was before (none stored, or no difference: None).
    Nvml { change: Option<HostChange> },
}

/// The inventory, with NVML's answer from the cache when the host is as it was stored for;
/// or an error once `nvml-timeout-ms` has passed without an answer.
pub fn load(config: &Config, scope: Scope) -> Result<(Inventory, Source), InventoryError> {
    load_from(config, true, scope)
}

/// NVML's answer kept in memory by a process that serves many containers (`nvhook nri`),
/// with the state of the host it was given for: used while the host is in that state, and
/// asked again (through [`load`], so the file cache serves when it can) once it is not. The
/// driver's files found around it are kept too, while a search would find the same.
#[derive(Debug, Default)]
pub struct Remembered {
    answer: Option<(Fingerprint, System)>,
    files: Option<Kept>,
}

impl Remembered {
    /// Like [`load`], from memory when the host is as it was.
    pub fn load(
        &mut self,
        config: &Config,
        scope: Scope,
    ) -> Result<(Inventory, Source), InventoryError> {
        let host_cache = HostCache::open(config)?.knowing(self.files.as_ref());
        // Taken before any query: a host that changes during one leaves the answer stale at
        // once, never wrongly fresh.
        let now = Fingerprint::now(config, &nvml_library(config, &host_cache)?);
        if let (Some(now), Some((then, system))) = (&now, &self.answer)
            && now == then
        {
            tracing::debug!("NVML's answer from memory");
            let inventory = super::around_kept(
                config,
                &host_cache,
                system.clone(),
                scope,
                Some(&mut self.files),
            )?;
            return Ok((inventory, Source::Cache));
        }
        let (inventory, source) = load(config, scope)?;
        self.answer = now.map(|f| (f, inventory.system()));
        Ok((inventory, source))
    }

    /// The host state the answer in memory is for: the state of the last [`Remembered::load`],
    /// where it could be read.
    pub fn fingerprint(&self) -> Option<&Fingerprint> {
        self.answer.as_ref().map(|(fingerprint, _)| fingerprint)
    }

    /// Forgets the answer and the files: a plan failed on them.
    pub fn forget(&mut self) {
        *self = Remembered::default();
    }
}

/// The inventory from NVML itself (a cached answer failed a plan); the cache gets the new one.
pub fn load_fresh(config: &Config, scope: Scope) -> Result<Inventory, InventoryError> {
    load_from(config, false, scope).map(|(inventory, _)| inventory)
}

/// The inventory from NVML asked now, with nothing read from or written to the cache:
/// for the commands that change nothing (`info`, `plan`, `cdi generate`).
pub fn load_uncached(config: &Config, scope: Scope) -> Result<Inventory, InventoryError> {
    let deadline = Instant::now() + config.nvml_timeout();
    let host_cache = HostCache::open(config)?;
    let system = query_in_child(config, &host_cache, deadline)?;
    super::around(config, &host_cache, system, scope)
}

fn load_from(
    config: &Config,
    use_cache: bool,
    scope: Scope,
) -> Result<(Inventory, Source), InventoryError> {
    // Read first: where it was found with this very loader cache, it names NVML's library.
    let kept = KeptFile::read(config, scope, use_cache);
    let host_cache = HostCache::open(config)?.knowing(kept.as_ref().and_then(|k| k.kept.as_ref()));
    let stored = NvmlCache::open(config, &nvml_library(config, &host_cache)?);
    let cached = || {
        stored
            .as_ref()
            .filter(|_| use_cache)
            .and_then(NvmlCache::read)
    };
    if let Some(system) = cached() {
        let inventory = around_stored(config, &host_cache, system, scope, kept)?;
        return Ok((inventory, Source::Cache));
    }
    // One query for a burst of starts: the lock's holder asks NVML, the others wait for its
    // answer. All within this start's own NVML time.
    let deadline = Instant::now() + config.nvml_timeout();
    let flight = stored.as_ref().and_then(|s| s.lock_query(deadline));
    if let Some(system) = flight.as_ref().and_then(|_| cached()) {
        tracing::debug!("another start asked NVML while this one waited");
        // Read again: that start kept its search too.
        let kept = KeptFile::read(config, scope, use_cache);
        let inventory = around_stored(config, &host_cache, system, scope, kept)?;
        return Ok((inventory, Source::Cache));
    }
    let answer = query_in_child(config, &host_cache, deadline)?;
    // Around the new answer, with its search kept as around a cached one: the next start need
    // not search again. A start whose plan failed on the cached answer (`load_fresh`) searches
    // anew, in case the kept search was what failed it.
    let inventory = around_stored(config, &host_cache, answer, scope, kept)?;
    let system = inventory.system();
    let previous = stored.as_ref().and_then(NvmlCache::previous);
    let change = previous.and_then(|old| HostChange::between(&old, &system));
    if let Some(change) = &change {
        tracing::info!(%change, "the host changed since NVML's stored answer");
    }
    if let Some(stored) = stored {
        stored.write(&system);
    }
    drop(flight);
    Ok((inventory, Source::Nvml { change }))
}

/// The file beside NVML's cached answer that keeps a search for the driver's files, with the
/// search a start before kept there (none where `use_kept` is false: this start searches anew).
struct KeptFile {
    path: std::path::PathBuf,
    kept: Option<Kept>,
}

impl KeptFile {
    /// None where NVML's answer is not cached: nothing is kept.
    fn read(config: &Config, scope: Scope, use_kept: bool) -> Option<KeptFile> {
        let path = kept_files::path(config, scope)?;
        let kept = use_kept.then(|| kept_files::read(&path)).flatten();
        Some(KeptFile { path, kept })
    }
}

/// [`around`](super::around), with the driver's files from the search `kept` holds, and this
/// start's search kept there when it made one.
fn around_stored(
    config: &Config,
    cache: &HostCache,
    system: System,
    scope: Scope,
    kept: Option<KeptFile>,
) -> Result<Inventory, InventoryError> {
    let Some(KeptFile { path, mut kept }) = kept else {
        return super::around(config, cache, system, scope);
    };
    let inventory = super::around_kept(config, cache, system, scope, Some(&mut kept))?;
    if let Some(kept) = kept.filter(|k| k.made_now) {
        kept_files::write(&path, &kept);
    }
    Ok(inventory)
}

/// The program beside nvhook that loads NVML: nvhook itself is static, and a static program
/// cannot load libnvidia-ml (glibc's dlopen there needs the exact glibc it was linked with).
pub const HELPER: &str = "nvhook-nvml";

/// Asks NVML through [`HELPER`], with no environment, for the library the driver root's
/// loader cache names.
fn query_in_child(
    config: &Config,
    host_cache: &HostCache,
    deadline: Instant,
) -> Result<System, InventoryError> {
    let library = nvml_library(config, host_cache)?;
    let helper = crate::binary_paths::beside_nvhook(HELPER);
    let mut command = helper_command(&helper, &library);
    // An engine that kills the hook at its timeout kills only the hook: without this, a
    // helper stuck in a hung NVML would outlive every start that gave up on it.
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|e| {
        child_err(format!(
            "cannot run {}: {e} (it is installed beside nvhook; reinstall nvhook)",
            helper.display()
        ))
    })?;
    let pipe = child.stdout.take().expect("the helper's stdout is a pipe");
    let result = read_reply(OwnedFd::from(pipe).into(), deadline, config.nvml_timeout());
    if result.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    } else if nix::unistd::getppid().as_raw() == 1 {
        // Our parent is the first process of this PID namespace (crun and runc run
        // createContainer hooks from the container's), which inherits any child we leave.
        // crun waits for a hook by its SIGCHLD and, handed the helper's instead, misses the
        // hook's exit until the hook's timeout fails the start; under runc the helper would
        // stay a zombie of the container's own process. So here it is waited for.
        let _ = child.wait();
    } else {
        // Reaped now if it is gone; otherwise by whoever inherits it (the runtime nvhook-runtime
        // execs, or the engine's subreaper once the hook has exited).
        let _ = child.try_wait();
    }
    result
}

/// `helper` run on NVML library `library` with no environment, at `/`, its stdin closed and its
/// stdout piped: the arguments of what to do are the caller's to add.
pub(super) fn helper_command(helper: &Path, library: &Path) -> Command {
    let mut command = Command::new(helper);
    command
        .arg(library)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    command
}

fn child_err(message: String) -> InventoryError {
    InventoryError::Child(message)
}

/// NVML's answer from the helper, or a timeout error at `deadline` (the start's own NVML
/// time, `timeout`, from when it began).
fn read_reply(
    mut pipe: std::fs::File,
    deadline: Instant,
    timeout: Duration,
) -> Result<System, InventoryError> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [nix::poll::PollFd::new(
            pipe.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ready = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms))
            .map_err(|e| child_err(format!("poll: {e}")))?;
        if ready == 0 && left.is_zero() {
            return Err(InventoryError::Timeout(timeout.as_millis()));
        }
        if ready == 0 {
            continue;
        }
        let n = pipe
            .read(&mut chunk)
            .map_err(|e| child_err(format!("read: {e}")))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let reply: Reply = serde_json::from_slice(&buf).map_err(|_| {
        child_err("the NVML query process died without an answer (crash in libnvidia-ml?)".into())
    })?;
    reply.map_err(InventoryError::Child)
}
