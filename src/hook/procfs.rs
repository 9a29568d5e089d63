//! The /proc/driver/nvidia overlay: a read-only tmpfs holding `params` (with device-file
//! modification off), `version`, `registry`, and the selected GPUs' `gpus/<busid>` only; or,
//! for NVIDIA's `disable-device-node-modification`, that `params` alone over the container's,
//! everything else of the directory (`capabilities/`, which MIG devices need) left as it is.

use crate::plan::{ProcOverlay, container_params};
use crate::rootfs::{Rootfs, RootfsError, sys};
use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};

pub const TARGET: &str = "/proc/driver/nvidia";

fn err(op: &'static str, path: &str, e: impl std::fmt::Display) -> RootfsError {
    RootfsError::Op {
        op,
        path: path.to_string(),
        message: e.to_string(),
    }
}

/// Everything taken from the host before entering the container's mount namespace.
pub struct Prepared {
    files: Vec<(&'static str, Vec<u8>)>,
    gpus: Vec<(String, OwnedFd)>,
}

pub fn prepare(overlay: &ProcOverlay) -> Result<Prepared, RootfsError> {
    let read = |name: &'static str| {
        let path = overlay.host_dir.join(name);
        std::fs::read(&path)
            .map(|b| (name, b))
            .map_err(|e| err("read", &path.display().to_string(), e))
    };
    let (_, params) = read("params")?;
    let params = container_params(&String::from_utf8_lossy(&params)).into_bytes();
    let mut files = vec![("params", params), read("version")?];
    // Not every driver has a registry file.
    files.extend(read("registry").ok());
    let gpus = overlay
        .gpus
        .iter()
        .map(|bus| {
            let path = overlay.host_dir.join("gpus").join(bus);
            let tree = sys::clone_tree_with(
                &path,
                false,
                sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
            )
            .map_err(|e| err("bind read-only", &path.display().to_string(), e))?;
            Ok((bus.clone(), tree))
        })
        .collect::<Result<_, RootfsError>>()?;
    Ok(Prepared { files, gpus })
}

/// Binds a read-only `params` with device-file modification off over the container's own, read
/// from `host_params`; returns false (and changes nothing) when the container's procfs has
/// no /proc/driver/nvidia/params.
pub fn apply_params(rootfs: &Rootfs, host_params: &std::path::Path) -> Result<bool, RootfsError> {
    const PARAMS: &str = "/proc/driver/nvidia/params";
    let (Some(dir), Some(target)) = (rootfs.resolve(TARGET), rootfs.resolve(PARAMS)) else {
        return Ok(false);
    };
    // As NVIDIA's hook: a host without the file, or whose driver modifies no device file
    // already, leaves the container's as it is.
    let host = match std::fs::read_to_string(host_params) {
        Ok(text) if text.lines().any(|l| l.starts_with("ModifyDeviceFiles: 1")) => text,
        Ok(_) => {
            tracing::info!("the host's params modify no device file: the container's kept");
            return Ok(true);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(path = %host_params.display(), "no host params: the container's kept");
            return Ok(true);
        }
        Err(e) => return Err(err("read", &host_params.display().to_string(), e)),
    };
    let params = container_params(&host);
    // The file is made on a tmpfs attached over the directory just long enough to clone it:
    // older kernels clone nothing out of a detached tmpfs.
    let tmpfs = sys::new_tmpfs(c"0555").map_err(|e| err("create tmpfs for", PARAMS, e))?;
    sys::attach(tmpfs.as_fd(), dir.as_fd()).map_err(|e| err("mount tmpfs on", TARGET, e))?;
    let file = write_new(tmpfs.as_fd(), "params", params.as_bytes(), PARAMS).and_then(|()| {
        let file = sys::clone_at(tmpfs.as_fd(), c"params").map_err(|e| err("bind", PARAMS, e))?;
        sys::set_attrs(
            file.as_fd(),
            sys::MOUNT_ATTR_RDONLY
                | sys::MOUNT_ATTR_NOSUID
                | sys::MOUNT_ATTR_NODEV
                | sys::MOUNT_ATTR_NOEXEC,
        )
        .map_err(|e| err("make read-only", PARAMS, e))?;
        Ok(file)
    });
    sys::detach(tmpfs.as_fd()).map_err(|e| err("unmount the tmpfs from", TARGET, e))?;
    sys::attach(file?.as_fd(), target.as_fd()).map_err(|e| err("mount", PARAMS, e))?;
    Ok(true)
}

/// Creates `name` (0444) in `dir` with `bytes`; `path` names it in errors.
fn write_new(
    dir: std::os::fd::BorrowedFd,
    name: &str,
    bytes: &[u8],
    path: &str,
) -> Result<(), RootfsError> {
    let c = CString::new(name).map_err(|e| err("write", path, e))?;
    let fd = sys::open_at(
        dir,
        &c,
        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
        0o444,
    )
    .map_err(|e| err("create", path, e))?;
    std::fs::File::from(fd)
        .write_all(bytes)
        .map_err(|e| err("write", path, e))
}

/// Applies the overlay; returns false (and changes nothing) when the container's procfs
/// has no /proc/driver/nvidia, as on a node with no kernel module loaded.
pub fn apply(rootfs: &Rootfs, prepared: Prepared) -> Result<bool, RootfsError> {
    let Some(target) = rootfs.resolve(TARGET) else {
        return Ok(false);
    };
    let tmpfs = sys::new_tmpfs(c"0555").map_err(|e| err("create tmpfs for", TARGET, e))?;
    // Attach first: mounting under a detached tree needs a newer kernel than GPU nodes run.
    sys::attach(tmpfs.as_fd(), target.as_fd()).map_err(|e| err("mount tmpfs on", TARGET, e))?;
    for (name, bytes) in &prepared.files {
        write_new(tmpfs.as_fd(), name, bytes, &format!("{TARGET}/{name}"))?;
    }
    if !prepared.gpus.is_empty() {
        sys::mkdir_at(tmpfs.as_fd(), c"gpus", 0o555).map_err(|e| err("create", TARGET, e))?;
    }
    for (bus, tree) in &prepared.gpus {
        let path = format!("{TARGET}/gpus/{bus}");
        let rel = CString::new(format!("gpus/{bus}")).map_err(|e| err("mount", &path, e))?;
        sys::mkdir_at(tmpfs.as_fd(), &rel, 0o555).map_err(|e| err("create", &path, e))?;
        let dir = sys::open_at(tmpfs.as_fd(), &rel, libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| err("open", &path, e))?;
        sys::attach(tree.as_fd(), dir.as_fd()).map_err(|e| err("mount", &path, e))?;
    }
    sys::set_attrs(
        tmpfs.as_fd(),
        sys::MOUNT_ATTR_RDONLY
            | sys::MOUNT_ATTR_NOSUID
            | sys::MOUNT_ATTR_NODEV
            | sys::MOUNT_ATTR_NOEXEC,
    )
    .map_err(|e| err("make read-only", TARGET, e))?;
    Ok(true)
}
