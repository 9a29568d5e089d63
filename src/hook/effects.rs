//! Everything the prestart hook does to the system, as a handful of operations: the seam
//! that lets the order the hook promises be unit-tested without root (`super::tests`).
//!
//! The two halves are two types: [`HostEffects`] runs in the host's namespaces, and only
//! [`HostEffects::enter_container`] yields the [`ContainerEffects`] that make nodes and
//! mounts. So nothing that touches a rootfs can happen before the hook is in the container's
//! mount namespace, which dies with the container: the compiler checks that part.

use super::HookError;
use super::procfs;
use super::userns::ContainerRoot;
use crate::plan::{DeviceNode, Mount, MountKind, Plan, ProcOverlay};
use crate::rootfs::{Existing, NEW_FILE, Rootfs, RootfsError, loader, op_err, sys};
use nvhook_cgroup::{self as cgroup, DeviceRule};
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The hook's effects in the host's namespaces.
pub trait HostEffects {
    /// A mount source, opened on the host and ready to attach.
    type Source;
    type Inside: ContainerEffects<Source = Self::Source>;
    /// Lets the container's cgroup open the device nodes in `rules`.
    fn allow_devices(&mut self, rules: &[DeviceRule]) -> Result<(), HookError>;
    fn open_source(&mut self, mount: &Mount) -> Result<Self::Source, HookError>;
    /// The host's node to bind in place of `node`, for a container whose device nodes cannot
    /// be made (one in a user namespace of its own); None where they can.
    fn open_node(&mut self, node: &DeviceNode) -> Result<Option<Self::Source>, HookError>;
    /// Readies the `/proc/driver/nvidia` overlay, when the host's driver has that directory.
    fn prepare_proc(&mut self, overlay: &ProcOverlay) -> Result<(), HookError>;
    fn enter_container(self) -> Result<Self::Inside, HookError>;
}

/// The hook's effects in the container's mount namespace, on its rootfs.
pub trait ContainerEffects {
    type Source;
    /// Makes `node`, or binds `host` (see [`HostEffects::open_node`]) on a file in its place.
    fn make_node(
        &mut self,
        node: &DeviceNode,
        host: Option<&Self::Source>,
    ) -> Result<(), HookError>;
    fn attach(&mut self, source: &Self::Source, mount: &Mount) -> Result<(), HookError>;
    /// The SONAME and development links, then the image's loader cache.
    fn link_and_cache(&mut self, plan: &Plan) -> Result<(), HookError>;
    /// Applies the overlay prepared on the host; whether there was one to apply.
    fn overlay_proc(&mut self) -> Result<bool, HookError>;
}

/// The real effects: cgroup files and bpf(2), open_tree, setns, and pathrs in the rootfs.
pub struct System {
    pid: i32,
    /// Opened through the container's mount namespace (`/proc/<pid>/root/...`), and used
    /// only once the hook is in it.
    rootfs: Rootfs,
    proc: Option<procfs::Prepared>,
    /// The container's root, where it is not the host's (see [`super::userns`]).
    root: Option<ContainerRoot>,
    /// Where cgroup v2 device programs are kept between containers (`device-program-pins`).
    device_program_pins: Option<PathBuf>,
}

impl System {
    pub fn new(
        pid: i32,
        rootfs: Rootfs,
        root: Option<ContainerRoot>,
        device_program_pins: Option<&Path>,
    ) -> System {
        System {
            pid,
            rootfs,
            proc: None,
            root,
            device_program_pins: device_program_pins.map(Path::to_owned),
        }
    }
}

/// [`System`] once inside the container's mount namespace.
pub struct SystemInside {
    rootfs: Rootfs,
    proc: Option<procfs::Prepared>,
}

impl HostEffects for System {
    type Source = OwnedFd;
    type Inside = SystemInside;

    fn allow_devices(&mut self, rules: &[DeviceRule]) -> Result<(), HookError> {
        let version = cgroup::allow_devices(self.pid, rules, self.device_program_pins.as_deref())?;
        tracing::debug!(?version, rules = rules.len(), "cgroup device rules set");
        Ok(())
    }

    fn open_source(&mut self, mount: &Mount) -> Result<OwnedFd, HookError> {
        open_source(mount)
    }

    /// In a user namespace of its own, the host's node as a detached bind mount (nosuid, and
    /// not nodev: it is a device).
    fn open_node(&mut self, node: &DeviceNode) -> Result<Option<OwnedFd>, HookError> {
        if self.root.is_none() {
            return Ok(None);
        }
        let fail = |source| HookError::Source {
            path: node.host_path.clone(),
            source,
        };
        let tree =
            sys::clone_tree_with(&node.host_path, false, sys::MOUNT_ATTR_NOSUID).map_err(fail)?;
        let st = sys::fstat(tree.as_fd()).map_err(fail)?;
        if sys::file_type(&st) != libc::S_IFCHR
            || (libc::major(st.st_rdev), libc::minor(st.st_rdev)) != (node.major, node.minor)
        {
            return Err(HookError::SourceKind {
                path: node.host_path.clone(),
                kind: "the planned char device",
            });
        }
        Ok(Some(tree))
    }

    fn prepare_proc(&mut self, overlay: &ProcOverlay) -> Result<(), HookError> {
        // /proc/driver/nvidia is the kernel module's, the same in every procfs instance:
        // without it here the container's procfs lacks it too, and trees cloned for the
        // overlay would only be dissolved again (an RCU grace period each).
        if Path::new(procfs::TARGET).is_dir() {
            self.proc = Some(procfs::prepare(overlay)?);
        }
        Ok(())
    }

    fn enter_container(self) -> Result<SystemInside, HookError> {
        enter_mount_ns(self.pid)?;
        act_as_container_root(self.root)?;
        Ok(SystemInside {
            rootfs: self.rootfs,
            proc: self.proc,
        })
    }
}

impl ContainerEffects for SystemInside {
    type Source = OwnedFd;

    fn make_node(&mut self, node: &DeviceNode, host: Option<&OwnedFd>) -> Result<(), HookError> {
        match host {
            None => {
                self.rootfs
                    .make_node(&node.path, node.major, node.minor, node.mode)?;
            }
            Some(host) => {
                let (target, _) = self.rootfs.mount_target(&node.path, MountKind::File)?;
                attach(host.as_fd(), target.as_fd(), &node.path)?;
            }
        }
        Ok(())
    }

    fn attach(&mut self, source: &OwnedFd, mount: &Mount) -> Result<(), HookError> {
        attach_in(&self.rootfs, source, mount)
    }

    fn link_and_cache(&mut self, plan: &Plan) -> Result<(), HookError> {
        loader::link_and_cache(
            &self.rootfs,
            &plan.symlinks,
            plan.layout.arch,
            (&plan.ldcache, &[]),
            &plan.ld_so_confs,
            plan.layout.ldcache,
        )?;
        Ok(())
    }

    fn overlay_proc(&mut self) -> Result<bool, HookError> {
        match self.proc.take() {
            Some(prepared) => Ok(procfs::apply(&self.rootfs, prepared)?),
            None => Ok(false),
        }
    }
}

/// Enters the mount namespace of the process `pid`; returns it, for coming back to it.
pub fn enter_mount_ns(pid: i32) -> Result<std::fs::File, HookError> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
        .map_err(|source| HookError::Namespace { pid, source })?;
    sys::enter_mount_ns(&ns).map_err(|source| HookError::Namespace { pid, source })?;
    Ok(ns)
}

/// Makes what the hook creates from here on the container root's, `root` where it is not the
/// host's (see super::userns); with the host's, the hook gives up changing its ids.
pub fn act_as_container_root(root: Option<ContainerRoot>) -> Result<(), HookError> {
    match root {
        Some(ContainerRoot { uid, gid }) => crate::privileges::act_as(uid, gid)
            .map_err(|source| HookError::ActAsRoot { uid, gid, source }),
        None => {
            crate::privileges::give_up_id_changes();
            Ok(())
        }
    }
}

/// `mount`'s source as a detached, read-only, nosuid, nodev tree, checked to be the kind of
/// file the plan expects.
pub fn open_source(mount: &Mount) -> Result<OwnedFd, HookError> {
    let fail = |source| HookError::Source {
        path: mount.source.clone(),
        source,
    };
    let tree = sys::clone_tree_with(
        &mount.source,
        mount.kind == MountKind::Dir,
        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
    )
    .map_err(fail)?;
    let st = sys::fstat(tree.as_fd()).map_err(fail)?;
    let (want, kind) = match mount.kind {
        MountKind::File => (libc::S_IFREG, "regular file"),
        MountKind::Socket => (libc::S_IFSOCK, "socket"),
        MountKind::Dir => (libc::S_IFDIR, "directory"),
    };
    if sys::file_type(&st) != want {
        return Err(HookError::SourceKind {
            path: mount.source.clone(),
            kind,
        });
    }
    Ok(tree)
}

/// Attaches `source` (from [`open_source`]) at `mount`'s destination, resolved inside
/// `rootfs`, from a process in the container's mount namespace.
pub fn attach_in(rootfs: &Rootfs, source: &OwnedFd, mount: &Mount) -> Result<(), HookError> {
    let (target, existing) = rootfs.mount_target(&mount.destination, mount.kind)?;
    attach(source.as_fd(), target.as_fd(), &mount.destination)?;
    if existing == Existing::Replaced {
        tracing::info!(path = %mount.destination, "covered the image's own file with the host's");
    }
    Ok(())
}

/// Attaches `tree` (a detached mount) on the directory `dir`, made in the rootfs where the image
/// lacks it.
pub fn attach_dir_in(rootfs: &Rootfs, tree: &OwnedFd, dir: &str) -> Result<(), HookError> {
    let (target, _) = rootfs.mount_target(dir, MountKind::Dir)?;
    Ok(attach(tree.as_fd(), target.as_fd(), dir)?)
}

/// A tmpfs of the container's own on the directory `dir`, made in the rootfs, holding each of
/// `files` (a path relative to `dir`, and its source from [`open_source`]) attached on a file
/// made there, and each of `links` (a relative path and its target); then read-only. One
/// directory in the container's layer where there would be a mount point for each file and a
/// link for each library.
pub fn tmpfs_tree_in(
    rootfs: &Rootfs,
    dir: &str,
    files: &[(&str, &OwnedFd)],
    links: &[(&str, &str)],
) -> Result<(), HookError> {
    // The mode a directory made in the layer gets; the tmpfs is read-only once filled.
    let tmpfs = sys::new_tmpfs(c"0755").map_err(|e| op_err("make a tmpfs for", dir, e))?;
    attach_dir_in(rootfs, &tmpfs, dir)?;
    let files: Vec<(&str, BorrowedFd)> = files.iter().map(|&(p, fd)| (p, fd.as_fd())).collect();
    fill_tree(tmpfs.as_fd(), dir, &files, links)?;
    // Recursive, as mount_setattr(2) is here: the files' mounts are read-only already.
    sys::set_attrs(tmpfs.as_fd(), sys::MOUNT_ATTR_RDONLY)
        .map_err(|e| op_err("make read-only", dir, e))?;
    Ok(())
}

/// Fills the empty directory `root` (`dir` on the error's path): each of `files` (a path
/// relative to it, and its source from [`open_source`]) attached on a file made there, and each
/// of `links` (a relative path and its target), with the directories holding them.
pub fn fill_tree(
    root: BorrowedFd,
    dir: &str,
    files: &[(&str, BorrowedFd)],
    links: &[(&str, &str)],
) -> Result<(), RootfsError> {
    let mut tree = TreeDirs {
        root,
        made: HashMap::new(),
    };
    for &(path, source) in files {
        let full = format!("{dir}/{path}");
        let (at, name) = tree.parent_of(&full, path)?;
        // A new inode of our own (O_EXCL, no link followed): its descriptor is the mount point.
        let point = sys::open_at(at, &name, NEW_FILE, 0o644)
            .map_err(|e| op_err("create mount point", &full, e))?;
        attach(source, point.as_fd(), &full)?;
    }
    for &(path, target) in links {
        let full = format!("{dir}/{path}");
        let (at, name) = tree.parent_of(&full, path)?;
        let target = CString::new(target).map_err(|e| op_err("link", &full, e))?;
        sys::symlink_at(&target, at, &name).map_err(|e| op_err("create link", &full, e))?;
    }
    Ok(())
}

/// The directories of a tree being filled, each made once and kept open by its path relative
/// to the tree's root.
struct TreeDirs<'a> {
    root: BorrowedFd<'a>,
    made: HashMap<String, OwnedFd>,
}

impl TreeDirs<'_> {
    /// The directory of `path` (relative, `full` in the container), its directories made on
    /// the way, and its last component.
    fn parent_of(
        &mut self,
        full: &str,
        path: &str,
    ) -> Result<(BorrowedFd<'_>, CString), RootfsError> {
        let (subdirs, name) = path.rsplit_once('/').unwrap_or(("", path));
        let ends = subdirs.match_indices('/').map(|(i, _)| i);
        for end in ends.chain([subdirs.len()]).filter(|&end| end > 0) {
            let prefix = &subdirs[..end];
            if self.made.contains_key(prefix) {
                continue;
            }
            let (up, part) = prefix.rsplit_once('/').unwrap_or(("", prefix));
            let at = if up.is_empty() {
                self.root
            } else {
                self.made[up].as_fd()
            };
            let part = CString::new(part).map_err(|e| op_err("use", full, e))?;
            sys::mkdir_at(at, &part, 0o755).map_err(|e| op_err("create directory", full, e))?;
            let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
            let opened =
                sys::open_at(at, &part, flags, 0).map_err(|e| op_err("open directory", full, e))?;
            self.made.insert(prefix.to_string(), opened);
        }
        let at = match self.made.get(subdirs) {
            Some(fd) => fd.as_fd(),
            None => self.root,
        };
        let name = CString::new(name).map_err(|e| op_err("use", full, e))?;
        Ok((at, name))
    }
}

fn attach(source: BorrowedFd, target: BorrowedFd, path: &str) -> Result<(), RootfsError> {
    sys::attach(source, target).map_err(|e| op_err("mount", path, e))
}
