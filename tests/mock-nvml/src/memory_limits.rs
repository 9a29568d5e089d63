//! Per-cgroup GPU memory limits (`nvmlDeviceSetMemoryLimits_v1`, `nvmlDeviceGetMemoryLimits_v1`),
//! with nvml.h's structs and return codes. The limits are kept in a file on the node, as the
//! driver keeps them across the processes that set and read them, and each Set call is
//! recorded, so that tests see the exact device, cgroup and bytes NVML was given. Built only
//! with the `memory-limits` feature: the mock without it is a driver from before CUDA 13.4.

#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_char, c_ulonglong};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::device::Device;
use crate::ffi::{guard, read_str, with_device};
use crate::handle::DeviceHandle;
use crate::state;
use crate::status::{NvmlResult, Status};
use crate::topology::MemoryLimitsLayout;

/// `NVML_DEVICE_MEMORY_LIMIT_MAX`: no limit.
const LIMIT_MAX: u64 = u64::MAX;

/// `nvmlSetMemoryLimits_v1_t`.
#[repr(C)]
pub struct NvmlSetMemoryLimitsV1 {
    name_space: *const c_char,
    soft_limit: c_ulonglong,
    hard_limit: c_ulonglong,
}

/// `nvmlGetMemoryLimits_v1_t`.
#[repr(C)]
pub struct NvmlGetMemoryLimitsV1 {
    name_space: *const c_char,
    soft_limit: c_ulonglong,
    hard_limit: c_ulonglong,
    current_used: c_ulonglong,
}

/// One GPU's limits for one cgroup directory, as the state file keeps them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Kept {
    gpu: String,
    path: PathBuf,
    /// The directory's (device, inode) when the limits were set: a cgroup removed and made
    /// again under the same path is another cgroup, whose limits the driver cleared.
    dir: (u64, u64),
    soft: u64,
    hard: u64,
}

/// What one Set call was asked, for its record line.
#[derive(Default, Serialize)]
struct Call {
    pid: u32,
    gpu: Option<String>,
    path: Option<String>,
    soft: Option<u64>,
    hard: Option<u64>,
    result: u32,
}

/// # Safety
/// `limits` is null or valid for reads of an `nvmlSetMemoryLimits_v1_t` whose `nameSpace` is
/// null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMemoryLimits_v1(
    device: DeviceHandle,
    limits: *mut NvmlSetMemoryLimitsV1,
) -> Status {
    guard(|| {
        let topology = state::topology()?;
        let layout = topology
            .memory_limits
            .as_ref()
            .ok_or(Status::NOT_SUPPORTED)?;
        let mut call = Call {
            pid: std::process::id(),
            ..Call::default()
        };
        let result = unsafe { set(layout, device, limits, &mut call) };
        call.result = result.err().unwrap_or(Status::SUCCESS).0;
        record(&layout.record, &call);
        result
    })
}

/// # Safety
/// As [`nvmlDeviceSetMemoryLimits_v1`]; `call` gets what was asked as it is read.
unsafe fn set(
    layout: &MemoryLimitsLayout,
    device: DeviceHandle,
    limits: *mut NvmlSetMemoryLimitsV1,
    call: &mut Call,
) -> NvmlResult {
    with_device(device, |_, d| {
        call.gpu = Some(d.uuid().to_owned());
        if limits.is_null() {
            return Err(Status::INVALID_ARGUMENT);
        }
        let asked = unsafe { &*limits };
        let path = unsafe { read_str(asked.name_space) };
        call.path = path.ok().map(str::to_owned);
        (call.soft, call.hard) = (Some(asked.soft_limit), Some(asked.hard_limit));
        if layout.error != Status::SUCCESS.0 {
            return Err(Status(layout.error));
        }
        let total = whole_gpu_memory(d)?;
        judge(asked.soft_limit, asked.hard_limit, total)?;
        let path = Path::new(path?);
        let dir = dir_id(path).ok_or(Status::OPERATING_SYSTEM)?;
        let (gpu, soft, hard) = (d.uuid(), asked.soft_limit, asked.hard_limit);
        with_kept(&layout.state, true, |kept| {
            // The driver forgets a cgroup's limits with the cgroup.
            kept.retain(|k| dir_id(&k.path) == Some(k.dir));
            kept.retain(|k| !(k.gpu == gpu && k.path == path));
            if (soft, hard) != (0, LIMIT_MAX) {
                kept.push(Kept {
                    gpu: gpu.to_owned(),
                    path: path.to_owned(),
                    dir,
                    soft,
                    hard,
                });
            }
        })
    })
}

/// # Safety
/// `limits` is null or valid for reads and writes of an `nvmlGetMemoryLimits_v1_t` whose
/// `nameSpace` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryLimits_v1(
    device: DeviceHandle,
    limits: *mut NvmlGetMemoryLimitsV1,
) -> Status {
    guard(|| {
        let topology = state::topology()?;
        let layout = topology
            .memory_limits
            .as_ref()
            .ok_or(Status::NOT_SUPPORTED)?;
        with_device(device, |_, d| {
            if limits.is_null() {
                return Err(Status::INVALID_ARGUMENT);
            }
            let asked = unsafe { &mut *limits };
            let path = Path::new(unsafe { read_str(asked.name_space) }?);
            if layout.error != Status::SUCCESS.0 {
                return Err(Status(layout.error));
            }
            whole_gpu_memory(d)?;
            // A cgroup removed took its limits with it, as the driver clears them.
            let dir = dir_id(path).ok_or(Status::NOT_FOUND)?;
            let found = with_kept(&layout.state, false, |kept| {
                kept.iter()
                    .find(|k| k.gpu == d.uuid() && k.path == path && k.dir == dir)
                    .cloned()
            })?;
            let found = found.ok_or(Status::NOT_FOUND)?;
            asked.soft_limit = found.soft;
            asked.hard_limit = found.hard;
            // The mock runs nothing on its GPUs.
            asked.current_used = 0;
            Ok(())
        })
    })
}

/// A GPU's total memory: NVML limits whole GPUs only, and only one that reports its memory.
fn whole_gpu_memory(device: Device<'_>) -> NvmlResult<u64> {
    device
        .physical(Status::NOT_SUPPORTED)?
        .memory_total
        .ok_or(Status::NOT_SUPPORTED)
}

/// nvml.h's rules for a Set: soft at most hard, and neither above the GPU's memory (MAX is no
/// limit).
fn judge(soft: u64, hard: u64, total: u64) -> NvmlResult {
    let above = |limit: u64| limit != LIMIT_MAX && limit > total;
    if soft > hard || above(soft) || above(hard) {
        return Err(Status::INVALID_ARGUMENT);
    }
    Ok(())
}

/// The (device, inode) of directory `path`; None when it is not one.
fn dir_id(path: &Path) -> Option<(u64, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    meta.is_dir().then(|| (meta.dev(), meta.ino()))
}

/// `change` on the limits kept in `path`, under a lock on the file (`exclusive`: written
/// back after), as processes set and read them at once.
fn with_kept<T>(
    path: &Path,
    exclusive: bool,
    change: impl FnOnce(&mut Vec<Kept>) -> T,
) -> NvmlResult<T> {
    let kept = || -> std::io::Result<T> {
        let mut file: File = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let lock = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        };
        // SAFETY: flock on a descriptor this function owns; released when it is closed.
        if unsafe { libc::flock(file.as_raw_fd(), lock) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let mut kept: Vec<Kept> = match text.is_empty() {
            true => Vec::new(),
            false => serde_json::from_str(&text)?,
        };
        let answer = change(&mut kept);
        if exclusive {
            file.set_len(0)?;
            file.rewind()?;
            file.write_all(&serde_json::to_vec_pretty(&kept)?)?;
        }
        Ok(answer)
    };
    kept().map_err(|_| Status::UNKNOWN)
}

/// Appends `call` as one JSON line to `record`. Best effort, like the init record.
fn record(record: &Path, call: &Call) {
    let Ok(mut line) = serde_json::to_vec(call) else {
        return;
    };
    line.push(b'\n');
    let file = OpenOptions::new().create(true).append(true).open(record);
    if let Ok(mut file) = file {
        let _ = file.write_all(&line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structs_are_nvml_hs() {
        assert_eq!(std::mem::size_of::<NvmlSetMemoryLimitsV1>(), 24);
        assert_eq!(std::mem::size_of::<NvmlGetMemoryLimitsV1>(), 32);
    }

    #[test]
    fn limits_follow_nvml_hs_rules() {
        let total = 80 << 30;
        assert_eq!(judge(1 << 30, 2 << 30, total), Ok(()));
        assert_eq!(judge(0, LIMIT_MAX, total), Ok(()), "clears them");
        assert_eq!(judge(total, LIMIT_MAX, total), Ok(()));
        assert_eq!(judge(total, total, total), Ok(()));
        for (soft, hard) in [
            (2, 1),
            (total + 1, LIMIT_MAX),
            (0, total + 1),
            (LIMIT_MAX, 1),
        ] {
            assert_eq!(
                judge(soft, hard, total),
                Err(Status::INVALID_ARGUMENT),
                "{soft} {hard}"
            );
        }
    }

    #[test]
    fn kept_limits_persist_in_their_file() {
        let dir = std::env::temp_dir().join(format!("mock-nvml-limits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state = dir.join("state.json");
        let entry = Kept {
            gpu: "GPU-1".into(),
            path: dir.clone(),
            dir: dir_id(&dir).unwrap(),
            soft: 1,
            hard: 2,
        };
        with_kept(&state, true, |kept| kept.push(entry.clone())).unwrap();
        let read = with_kept(&state, false, |kept| kept.clone()).unwrap();
        assert_eq!(read, [entry]);
        assert_eq!(dir_id(&state), None, "a file is no cgroup directory");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
