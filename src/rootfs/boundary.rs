//! The mounts nvhook may write on: the container's own root filesystem and the filesystems the
//! runtime made for this container alone (its /dev tmpfs, say), never a bind mount.
//!
//! Resolving inside the rootfs keeps an image's links inside the root, but a link may still
//! lead onto a bind mount the runtime put there: a host directory (Docker `-v`, hostPath, a
//! PVC) or the engine's (emptyDir, /etc/hosts). nvhook runs as root with DAC_OVERRIDE, so
//! anything it made there would be a host change the container's own user could not make,
//! and it would outlive the container. Every directory nvhook writes in is checked by its
//! mount id against this set before anything is created in it.

use super::{Rootfs, RootfsError, sys};
use crate::echo::Echo;
use crate::oci::MountPoint;
use std::os::fd::{AsFd, BorrowedFd};

#[derive(Debug, Default)]
pub(super) struct Boundary {
    /// Mount ids nvhook may write on.
    own: Vec<u64>,
    /// The spec's bind mounts, by mount id, to name them in a refusal.
    volumes: Vec<(u64, String)>,
}

impl Boundary {
    pub(super) fn new(root: BorrowedFd) -> Result<Boundary, std::io::Error> {
        Ok(Boundary {
            own: vec![sys::mount_id(root)?],
            volumes: Vec::new(),
        })
    }

    /// Whether `dir` is on a mount nvhook may write on.
    pub(super) fn allows(&self, dir: BorrowedFd) -> bool {
        sys::mount_id(dir).is_ok_and(|id| self.own.contains(&id))
    }

    fn volume(&self, id: u64) -> Option<&str> {
        self.volumes
            .iter()
            .find(|(v, _)| *v == id)
            .map(|(_, d)| d.as_str())
    }
}

impl Rootfs {
    /// Adds the runtime's own mounts of the spec (already mounted: the caller is in the
    /// container's mount namespace) to the mounts nvhook writes on, and remembers its bind
    /// mounts to name them. A destination that does not resolve is skipped: nothing is there.
    pub fn with_mounts(mut self, mounts: &[MountPoint]) -> Rootfs {
        for m in mounts {
            let Some(id) = self
                .root
                .resolve(&m.destination)
                .ok()
                .and_then(|h| sys::mount_id(h.as_fd()).ok())
            else {
                continue;
            };
            if m.bind {
                self.boundary.volumes.push((id, m.destination.clone()));
            } else if !self.boundary.own.contains(&id) {
                self.boundary.own.push(id);
            }
        }
        self
    }

    /// The refusal for writing `path`, whose directory `dir` is not on the container's own
    /// filesystems: names the first component of `dir` that leaves them, and how.
    #[cold]
    #[inline(never)]
    pub(super) fn volume_error(&self, path: &str, dir: &str) -> RootfsError {
        let mut prefix = String::new();
        for part in dir.split('/').filter(|p| !p.is_empty()) {
            prefix.push('/');
            prefix.push_str(part);
            let Some(id) = self
                .root
                .resolve(&prefix)
                .ok()
                .and_then(|h| sys::mount_id(h.as_fd()).ok())
                .filter(|id| !self.boundary.own.contains(id))
            else {
                continue;
            };
            let mount = match self.boundary.volume(id) {
                Some(dest) if dest == prefix => format!("the volume mounted at {dest}"),
                Some(dest) => format!("in the volume mounted at {dest}"),
                None => "on a mount that is not the container's own filesystem".to_string(),
            };
            let (why, fix) = match self.root.readlink(&prefix) {
                Ok(target) => (
                    format!(
                        "the image's {prefix} is a link to {}, {mount}",
                        Echo(target.to_string_lossy())
                    ),
                    "point the image's link into the image, or mount the volume elsewhere",
                ),
                Err(_) => (format!("{prefix} is {mount}"), "mount the volume elsewhere"),
            };
            return RootfsError::Volume {
                path: path.to_string(),
                why,
                fix,
            };
        }
        RootfsError::Volume {
            path: path.to_string(),
            why: format!("{dir} is not on the container's own filesystem"),
            fix: "mount the volume elsewhere",
        }
    }
}
