//! Loading the inventory in a child process.
//!
//! A real libnvidia-ml may start threads, and setns(CLONE_NEWNS) refuses a process whose
//! fs struct is shared with other threads; NVML can also hang for seconds without
//! persistence mode. A forked child keeps the hook single-threaded and bounds NVML's time.
//!
//! The child answers before NVML is shut down, and the parent does not wait for it to exit:
//! on an H100 with driver 580, nvmlShutdown, or the driver's clean-up when the process
//! exits without it, takes ~2.5 ms that the container start need not pay.

use super::cache::NvmlCache;
use super::driver::HostCache;
use super::{Inventory, InventoryError, nvml_library};
use crate::config::Config;
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::{ForkResult, fork};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

type Reply = Result<Inventory, String>;

/// Where the NVML part of an inventory came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// NVML's answer kept from an earlier start, for the same host state.
    Cache,
    Nvml,
}

/// The inventory, with NVML's answer from the cache when the host is as it was stored for;
/// or an error once `nvml-timeout-ms` has passed without an answer.
pub fn load(config: &Config) -> Result<(Inventory, Source), InventoryError> {
    load_from(config, true)
}

/// The inventory from NVML itself (a kept answer failed a plan); the cache gets the new one.
pub fn load_fresh(config: &Config) -> Result<Inventory, InventoryError> {
    load_from(config, false).map(|(inventory, _)| inventory)
}

fn load_from(config: &Config, use_kept: bool) -> Result<(Inventory, Source), InventoryError> {
    let host_cache = HostCache::read(config)?;
    let stored = NvmlCache::open(config, &nvml_library(config, &host_cache)?);
    let kept = stored
        .as_ref()
        .filter(|_| use_kept)
        .and_then(NvmlCache::read);
    if let Some(system) = kept {
        let inventory = Inventory::around(config, &host_cache, system)?;
        return Ok((inventory, Source::Cache));
    }
    let inventory = query_in_child(config, &host_cache)?;
    if let Some(stored) = stored {
        stored.write(&inventory.system());
    }
    Ok((inventory, Source::Nvml))
}

/// The child uses the parent's reading of the driver root's loader cache: a fork's copy.
fn query_in_child(config: &Config, host_cache: &HostCache) -> Result<Inventory, InventoryError> {
    let (read_end, write_end) = nix::unistd::pipe().map_err(|e| child_err(format!("pipe: {e}")))?;
    // SAFETY: the hook is single-threaded here, so the child is a faithful copy; it only
    // queries, writes its answer and leaves with _exit.
    match unsafe { fork() }.map_err(|e| child_err(format!("fork: {e}")))? {
        ForkResult::Child => {
            drop(read_end);
            // Kept alive to the end: _exit runs no destructor, so NVML is never shut down.
            let loaded = Inventory::load_with_nvml(config, host_cache);
            let reply = loaded.as_ref().map(|(inventory, _)| inventory);
            let reply: Result<&Inventory, String> = reply.map_err(|e| e.to_string());
            let code = match serde_json::to_vec(&reply) {
                Ok(bytes) => i32::from(std::fs::File::from(write_end).write_all(&bytes).is_err()),
                Err(_) => 1,
            };
            // The answer's pipe is closed above; closing stdio now too means that a runtime
            // collecting the hook's output does not wait for the driver's clean-up either.
            for fd in 0..=2 {
                // SAFETY: the child owns no std handle that uses these descriptors again.
                unsafe { libc::close(fd) };
            }
            // SAFETY: _exit skips atexit handlers and destructors that belong to the parent.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            drop(write_end);
            let result = read_reply(std::fs::File::from(read_end), config.nvml_timeout());
            if result.is_err() {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                let _ = waitpid(child, None);
            } else {
                // Reaped now if it is gone; otherwise by whoever inherits it (the runtime the
                // shim execs, or the engine's subreaper once the hook has exited).
                let _ = waitpid(child, Some(WaitPidFlag::WNOHANG));
            }
            result
        }
    }
}

fn child_err(message: String) -> InventoryError {
    InventoryError::Child(message)
}

fn read_reply(mut pipe: std::fs::File, timeout: Duration) -> Result<Inventory, InventoryError> {
    let deadline = Instant::now() + timeout;
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
