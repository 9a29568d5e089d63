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
use crate::oci::MountPoint;
use crate::shown::Shown;
use std::cell::OnceCell;
use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

/// The rootfs's own mount, and the spec's mounts, told apart only when a directory nvhook
/// writes in is on another mount: most writes are on the rootfs, and a start then never
/// resolves the spec's mount destinations at all.
#[derive(Debug)]
pub(super) struct Boundary {
    root: u64,
    mounts: Vec<MountPoint>,
    resolved: OnceCell<Resolved>,
}

/// The spec's mounts as they are mounted.
#[derive(Debug, Default)]
struct Resolved {
    /// Mount ids nvhook may write on besides the rootfs's.
    own: Vec<u64>,
    /// The spec's bind mounts, by mount id, to name them in a refusal.
    volumes: Vec<(u64, String)>,
}

impl Boundary {
    pub(super) fn new(root: BorrowedFd) -> Result<Boundary, std::io::Error> {
        Ok(Boundary {
            root: sys::mount_id(root)?,
            mounts: Vec::new(),
            resolved: OnceCell::new(),
        })
    }
}

impl Resolved {
    fn volume(&self, id: u64) -> Option<&str> {
        self.volumes
            .iter()
            .find(|(v, _)| *v == id)
            .map(|(_, d)| d.as_str())
    }
}

impl Rootfs {
    /// The runtime's own mounts of the spec are added to the mounts nvhook writes on, and its
    /// bind mounts are remembered to name them. They are resolved when first needed, through
    /// this rootfs, so it must lead into the container's mount namespace (opened there, or
    /// through `/proc/<pid>/root`).
    pub fn with_mounts(mut self, mounts: &[MountPoint]) -> Rootfs {
        self.boundary.mounts = mounts.to_vec();
        self
    }

    /// Whether `dir` is on a mount nvhook may write on.
    pub(super) fn allows(&self, dir: BorrowedFd) -> bool {
        sys::mount_id(dir)
            .is_ok_and(|id| id == self.boundary.root || self.resolved().own.contains(&id))
    }

    /// The spec's mounts resolved: a destination that does not resolve is skipped (nothing is
    /// there). `mounts` are in the order they were made. A later mount on the same
    /// destination (a host directory bound over the runtime's /dev tmpfs) hides the earlier
    /// one, and both entries resolve to it: the last entry that reaches a mount says what it is.
    fn resolved(&self) -> &Resolved {
        self.boundary.resolved.get_or_init(|| {
            let mut resolved = Resolved::default();
            for m in &self.boundary.mounts {
                let Some(id) = self
                    .root
                    .resolve(&m.destination)
                    .ok()
                    .and_then(|h| sys::mount_id(h.as_fd()).ok())
                    .filter(|id| *id != self.boundary.root)
                else {
                    continue;
                };
                resolved.own.retain(|own| *own != id);
                resolved.volumes.retain(|(volume, _)| *volume != id);
                if m.bind {
                    resolved.volumes.push((id, m.destination.clone()));
                } else {
                    resolved.own.push(id);
                }
            }
            resolved
        })
    }

    /// The refusal for writing `path`, whose directory `dir` is not on the container's own
    /// filesystems: names the first component of `dir` that leaves them, and how.
    #[cold]
    #[inline(never)]
    pub(super) fn volume_error(&self, path: &str, dir: &str) -> RootfsError {
        for prefix in prefixes(dir) {
            let Some(id) = self
                .root
                .resolve(&prefix)
                .ok()
                .and_then(|h| sys::mount_id(h.as_fd()).ok())
                .filter(|id| *id != self.boundary.root && !self.resolved().own.contains(id))
            else {
                continue;
            };
            let mount = match self.resolved().volume(id) {
                Some(dest) => on_volume(&prefix, dest),
                None => "on a mount that is not the container's own filesystem".to_string(),
            };
            return self.refusal(path, &prefix, mount);
        }
        RootfsError::Volume {
            path: path.to_string(),
            why: format!("{dir} is not on the container's own filesystem"),
            fix: "mount the volume elsewhere",
        }
    }

    /// For a runtime that makes the mount points of `paths` itself (nvhook-runtime's cdi mode
    /// lists the plan's mounts in config.json): refuses a path whose directory leads under one
    /// of the spec's bind mounts. The container's mount namespace does not exist yet, so this
    /// is by path, seen from the host: each component of the directory and each bind's
    /// destination resolved inside the rootfs, links followed as the runtime follows them.
    pub fn check_binds<'a>(
        &self,
        paths: impl IntoIterator<Item = &'a str>,
        mounts: &[MountPoint],
    ) -> Result<(), RootfsError> {
        let binds: Vec<(String, &str)> = mounts
            .iter()
            .filter(|m| m.bind)
            .map(|m| {
                let real = self.in_image(&m.destination);
                (
                    real.unwrap_or_else(|| m.destination.clone()),
                    m.destination.as_str(),
                )
            })
            .collect();
        if binds.is_empty() {
            return Ok(());
        }
        let mut seen = HashSet::new();
        for path in paths {
            let Some((dir, _)) = path.rsplit_once('/') else {
                continue;
            };
            if !seen.insert(dir) {
                continue;
            }
            // The directory as the runtime will reach it, component by component: an
            // existing one as it resolves, a link to what is not there yet (a bind mount's
            // destination the runtime makes) by its target, a missing one as it is named.
            let mut real = String::new();
            for prefix in prefixes(dir) {
                let named = format!("{real}/{}", prefix.rsplit('/').next().unwrap_or(""));
                real = match self.in_image(&named) {
                    Some(existing) => existing,
                    None => match self.root.readlink(&named) {
                        Ok(target) => lexical(&real, &target.to_string_lossy()),
                        Err(_) => named,
                    },
                };
                let under = |bind: &str| {
                    real == bind
                        || real
                            .strip_prefix(bind)
                            .is_some_and(|rest| rest.starts_with('/'))
                };
                if let Some((_, dest)) = binds.iter().find(|(real, _)| under(real)) {
                    return Err(self.refusal(path, &prefix, on_volume(&prefix, dest)));
                }
            }
        }
        Ok(())
    }

    /// `path` as the image names it once every link is resolved (`/data/lib` for a
    /// `/usr/lib/x86_64-linux-gnu` that links there); None when it does not exist.
    fn in_image(&self, path: &str) -> Option<String> {
        let real = |fd: BorrowedFd| std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let handle = self.root.resolve(path).ok()?;
        let (real, root) = (real(handle.as_fd()).ok()?, real(self.root.as_fd()).ok()?);
        let inside = real.strip_prefix(&root).ok()?;
        Some(format!("/{}", inside.display()))
    }

    /// The one-line refusal: `prefix`, on the path to `path`, is (or links to) `mount`.
    fn refusal(&self, path: &str, prefix: &str, mount: String) -> RootfsError {
        let (why, fix) = match self.root.readlink(prefix) {
            Ok(target) => (
                format!(
                    "the image's {prefix} is a link to {}, {mount}",
                    Shown(target.to_string_lossy())
                ),
                "point the image's link into the image, or mount the volume elsewhere",
            ),
            Err(_) => (format!("{prefix} is {mount}"), "mount the volume elsewhere"),
        };
        RootfsError::Volume {
            path: path.to_string(),
            why,
            fix,
        }
    }
}

/// `/a`, `/a/b`, `/a/b/c` of `/a/b/c`.
fn prefixes(dir: &str) -> impl Iterator<Item = String> + '_ {
    dir.split('/')
        .filter(|p| !p.is_empty())
        .scan(String::new(), |prefix, part| {
            prefix.push('/');
            prefix.push_str(part);
            Some(prefix.clone())
        })
}

/// `target`, a link's in the directory `dir`, as a path from the root: `..` and `.` taken
/// lexically, never above the root (as the runtime resolves it inside the rootfs).
fn lexical(dir: &str, target: &str) -> String {
    let start = if target.starts_with('/') { "" } else { dir };
    let mut parts: Vec<&str> = start.split('/').filter(|p| !p.is_empty()).collect();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Where `prefix` is, relative to the volume mounted at `dest`.
fn on_volume(prefix: &str, dest: &str) -> String {
    if dest == prefix {
        format!("the volume mounted at {dest}")
    } else {
        format!("in the volume mounted at {dest}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(destination: &str) -> MountPoint {
        MountPoint {
            destination: destination.into(),
            bind: true,
        }
    }

    #[test]
    fn link_targets_taken_lexically_inside_the_root() {
        assert_eq!(lexical("/usr/lib", "/data/lib"), "/data/lib");
        assert_eq!(lexical("/usr/lib", "../../data/./x"), "/data/x");
        assert_eq!(lexical("/usr", "../../../../data"), "/data");
        assert_eq!(lexical("", "lib64"), "/lib64");
    }

    #[test]
    fn prefixes_of_a_directory() {
        assert_eq!(
            prefixes("/usr/lib/x").collect::<Vec<_>>(),
            ["/usr", "/usr/lib", "/usr/lib/x"]
        );
        assert_eq!(prefixes("/").count(), 0);
    }

    #[test]
    fn paths_an_image_link_leads_under_a_bind_mount_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for dir in ["data/lib", "usr/bin", "etc", "srv/database"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        std::os::unix::fs::symlink("/data/lib", root.join("usr/lib")).unwrap();
        let r = Rootfs::open(root).unwrap();
        let mounts = [
            bind("/data"),
            bind("/etc/hosts"),
            MountPoint {
                destination: "/srv".into(),
                bind: false,
            },
        ];
        let e = r
            .check_binds(["/usr/bin/nvidia-smi", "/usr/lib/libcuda.so.1"], &mounts)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot write /usr/lib/libcuda.so.1 in the container: the image's /usr/lib is a link to /data/lib, in the volume mounted at /data: nvhook will not write into a volume (point the image's link into the image, or mount the volume elsewhere)"
        );
        // A bind mount of a file beside the target, a fresh mount, and directories the
        // runtime will create are no volume.
        r.check_binds(
            ["/etc/ld.so.cache", "/srv/database/x", "/opt/new/dir/file"],
            &mounts,
        )
        .unwrap();
        // Straight under a volume's destination, with no link on the way.
        // The volume's mount point is not in the image yet: the runtime makes it.
        std::os::unix::fs::symlink("/vol/sub", root.join("opt")).unwrap();
        let e = r
            .check_binds(["/opt/lib/x.so"], &[bind("/vol")])
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("the image's /opt is a link to /vol/sub, in the volume mounted at /vol"),
            "{e}"
        );
        let e = r.check_binds(["/data/x.so"], &mounts).unwrap_err();
        assert!(
            e.to_string()
                .contains("/data is the volume mounted at /data: nvhook will not write into a volume (mount the volume elsewhere)"),
            "{e}"
        );
    }
}
