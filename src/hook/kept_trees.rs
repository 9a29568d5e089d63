//! The CDI hook's trees ([`super::dir_groups`]) kept on the host between containers. Made in
//! each container, a tree costs a tmpfs, a mount point and a mount for each file, a link for
//! each library and the directories holding them. Kept, it is made once per node and driver,
//! in [`super::gathered`]'s store beside NVML's cached answer (`hook-trees`), and each
//! container gets a read-only recursive copy of it: one clone and one attach. Copies are
//! private and the container's own, so a tree removed on the host (its driver upgraded) stays
//! whole in the containers that have it.
//!
//! Only at createRuntime, where the hook starts in the runtime's mount namespace and visits it
//! again for the copies, and only for a container without a user namespace of its own, whose
//! root is the host's and so owns the tree as it would own a tmpfs of its own. A tree that
//! cannot be had is logged, and the container gets a tmpfs of its own as without a store. The
//! files that could be in a tree are opened on the same visit, where no copy holds them: a
//! start that gets the copies opens none of them.

use super::dir_groups::DirGroup;
use super::gathered::{Contents, GatherError, OpenStore, Store};
use super::{HookError, effects};
use crate::config::Config;
use crate::delivery::hook_args::LinkArgs;
use crate::rootfs::sys;
use std::fs::File;
use std::os::fd::OwnedFd;

/// The store's name in nvhook's state directory.
pub const DIR_NAME: &str = "hook-trees";

/// The store, and the runtime's mount namespace that holds it.
pub struct KeptTrees {
    store: Store,
    runtime_ns: File,
}

impl KeptTrees {
    /// The store beside NVML's cached answer, from the runtime's mount namespace (the hook's
    /// now); None where nvhook keeps nothing between starts (`nvml-cache-file = ""`), or where
    /// that namespace cannot be opened.
    pub fn open(config: &Config) -> Option<KeptTrees> {
        Some(KeptTrees {
            store: Store::new(config.nvml_cache()?.parent()?.join(DIR_NAME)),
            runtime_ns: File::open("/proc/self/ns/mnt").ok()?,
        })
    }

    /// One visit to the runtime's mount namespace, back in the container's (`container`: its
    /// process and that namespace, which the hook is in) after:
    /// for each of `groups`, a detached, read-only, nosuid, nodev, private copy of its kept
    /// tree, made where there is none yet (None for a group whose tree cannot be had); and each
    /// source still None in `sources` that no copy holds, opened.
    pub fn visit(
        &self,
        groups: &[DirGroup],
        args: &LinkArgs,
        sources: &mut [Option<OwnedFd>],
        (pid, container): (i32, &File),
    ) -> Result<Vec<Option<OwnedFd>>, HookError> {
        let here = std::process::id() as i32;
        sys::enter_mount_ns(&self.runtime_ns)
            .map_err(|source| HookError::Namespace { pid: here, source })?;
        let copies: Vec<_> = match self.store.open() {
            Ok(store) => groups.iter().map(|g| copy(&store, g, args)).collect(),
            Err(e) => {
                tracing::info!("the trees get a tmpfs of their own: no store for them: {e}");
                groups.iter().map(|_| None).collect()
            }
        };
        let in_copies = |i| {
            (groups.iter().zip(&copies)).any(|(g, copy)| copy.is_some() && g.mounts.contains(&i))
        };
        let opened = (sources.iter_mut().enumerate())
            .filter(|(i, source)| source.is_none() && !in_copies(*i))
            .try_for_each(|(i, source)| {
                *source = Some(effects::open_source(&args.mounts[i])?);
                Ok(())
            });
        sys::enter_mount_ns(container).map_err(|source| HookError::Namespace { pid, source })?;
        opened.map(|()| copies)
    }
}

/// A copy of `group`'s tree in `store`, made where it is not yet; None, logged, where it cannot
/// be had.
fn copy(store: &OpenStore, group: &DirGroup, args: &LinkArgs) -> Option<OwnedFd> {
    let contents = Contents {
        files: (group.mounts.iter())
            .map(|&i| {
                let mount = &args.mounts[i];
                (group.relative(&mount.destination), mount.source.as_path())
            })
            .collect(),
        links: (group.links.iter())
            .map(|&i| {
                let link = &args.symlinks[i];
                (group.relative(&link.path), link.target.as_str())
            })
            .collect(),
    };
    let attrs = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
    let copied = store.gather(&contents).and_then(|kept| {
        let copy =
            sys::clone_tree_with(&kept.path, true, attrs).map_err(|source| GatherError::Io {
                op: "copy",
                path: kept.path.clone(),
                source,
            })?;
        Ok((kept, copy))
    });
    match copied {
        Ok((kept, copy)) => {
            if kept.made {
                tracing::info!(
                    dir = %group.dir,
                    tree = %kept.path.display(),
                    files = contents.files.len(),
                    links = contents.links.len(),
                    "a tree kept on the host for the containers that get this directory"
                );
            }
            Some(copy)
        }
        Err(e) => {
            tracing::info!(dir = %group.dir, "the directory gets a tmpfs of its own: no kept tree: {e}");
            None
        }
    }
}
