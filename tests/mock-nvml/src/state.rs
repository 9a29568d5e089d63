//! The library's global state: init reference count and the loaded topology.

use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::{ptr, thread, time::Duration};

use crate::status::{NvmlResult, Status};
use crate::topology::{TOPOLOGY_FILE, Topology, TopologyError};

struct State {
    /// NVML counts inits: only the shutdown matching the first init tears down.
    refcount: u32,
    /// An `Arc` so queries run without holding the lock.
    topology: Option<Arc<Topology>>,
}

static STATE: Mutex<State> = Mutex::new(State {
    refcount: 0,
    topology: None,
});

fn lock() -> MutexGuard<'static, State> {
    // No code path panics while holding the lock, and the state stays consistent
    // even if one did, so a poisoned lock is safe to keep using.
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `nvmlInit_v2`: reads the topology anew on every call so its fault injection applies
/// to each one, but keeps the first successful topology while initialised, as handles
/// given out earlier must keep meaning the same devices.
pub fn init() -> NvmlResult {
    let dir = library_dir().ok_or(TopologyError::Missing)?;
    let topology = Topology::load(&dir)?;
    if let Some(record) = &topology.init_record {
        record_init(record);
    }
    // Sleep unlocked, so a slow init does not stall other threads' queries.
    thread::sleep(Duration::from_millis(topology.init_delay_ms));
    if topology.init_error != Status::SUCCESS.0 {
        return Err(Status(topology.init_error));
    }
    let mut state = lock();
    if state.refcount == 0 {
        state.topology = Some(Arc::new(topology));
    }
    state.refcount = state.refcount.saturating_add(1);
    Ok(())
}

/// Each init appends its process id to the topology's `init_record`, so that tests count
/// what a real driver would be asked (an init costs seconds on a big node without persistence
/// mode). Outside the driver's directories, whose state nvhook's cache fingerprints. Best
/// effort: an unwritable record records nothing.
fn record_init(record: &std::path::Path) {
    use std::io::Write;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(record);
    if let Ok(mut file) = file {
        let _ = writeln!(file, "{}", std::process::id());
    }
}

pub fn shutdown() -> NvmlResult {
    let mut state = lock();
    state.refcount = state.refcount.checked_sub(1).ok_or(Status::UNINITIALIZED)?;
    if state.refcount == 0 {
        state.topology = None;
    }
    Ok(())
}

/// The topology, or `UNINITIALIZED` before init and after the last shutdown.
pub fn topology() -> NvmlResult<Arc<Topology>> {
    lock().topology.clone().ok_or(Status::UNINITIALIZED)
}

/// Changes the topology as `change` says, with what it returns: the new topology is written
/// back beside the library, for the processes that load it next, and answers this one's
/// queries from now on. A change that fails leaves both as they were.
pub fn update<T>(change: impl FnOnce(&mut Topology) -> NvmlResult<T>) -> NvmlResult<T> {
    let mut state = lock();
    let mut topology = Topology::clone(state.topology.as_ref().ok_or(Status::UNINITIALIZED)?);
    let answer = change(&mut topology)?;
    let dir = library_dir().ok_or(Status::UNKNOWN)?;
    write_topology(&dir, &topology).map_err(|_| Status::UNKNOWN)?;
    state.topology = Some(Arc::new(topology));
    Ok(answer)
}

/// Replaces the topology file in one step: a process that loads it meanwhile reads the old one
/// or the new one, never half of one.
fn write_topology(dir: &std::path::Path, topology: &Topology) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(topology).map_err(std::io::Error::other)?;
    let staged = dir.join(format!(".{TOPOLOGY_FILE}.{}", std::process::id()));
    std::fs::write(&staged, text)?;
    std::fs::rename(&staged, dir.join(TOPOLOGY_FILE))
}

/// The directory this library was loaded from. The hook clears its environment
/// before loading NVML, so the library must find its topology by itself: `dladdr`
/// on one of its own statics names the file the dynamic loader mapped.
fn library_dir() -> Option<PathBuf> {
    // SAFETY: an all-zero Dl_info is a valid "nothing found" value for dladdr to fill.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: the address is of a static in this object; info is a valid out pointer.
    let found = unsafe { libc::dladdr(ptr::addr_of!(STATE).cast(), &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr succeeded, so dli_fname is a NUL-terminated string owned by the
    // loader that lives as long as this library stays mapped.
    let file = unsafe { CStr::from_ptr(info.dli_fname) };
    let file = std::path::Path::new(OsStr::from_bytes(file.to_bytes()));
    file.parent().map(PathBuf::from)
}
