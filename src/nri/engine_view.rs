//! The engine's view of the host's mounts, where the plugin gathers driver directories
//! ([`super::driver_trees`]): the runtime binds them by path, as the engine resolves paths.
//!
//! A plugin started by a unit shares the engine's mount namespace. One in a DaemonSet's
//! container has a namespace of its own, where its mounts never reach the engine; given the
//! engine's pid (the pod's `hostPID`), it makes them in the engine's namespace instead, from
//! a thread that entered it. Paths there are the plugin's own only where the engine's root is
//! its namespace's root and the plugin's is the host's (the DaemonSet chroots into it): an
//! engine that runs chrooted is left to per-file mounts.

use crate::rootfs::sys;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// Where mounts the engine can see are made.
#[derive(Debug, Clone)]
pub enum EngineView {
    /// The engine shares this process's mount namespace.
    Shared,
    /// The engine's mount namespace, entered for each piece of work.
    Entered(Arc<OwnedFd>),
    /// Nowhere: the reason, for the log.
    Unseen(String),
}

impl EngineView {
    /// The view of the engine that is process `pid` (as this process's pid namespace numbers
    /// it; None or 0 where the kernel gave none).
    pub fn of(pid: Option<i32>) -> EngineView {
        let Some(pid) = pid.filter(|&p| p > 0) else {
            return EngineView::Unseen(
                "the engine's pid is not visible here (a plugin in a pod needs hostPID)".into(),
            );
        };
        match crate::hook::container_mounts::shares_our_mount_ns(pid) {
            Ok(true) => return EngineView::Shared,
            Ok(false) => {}
            Err(e) => {
                return EngineView::Unseen(format!(
                    "the engine's mount namespace cannot be read: {e}"
                ));
            }
        }
        let opened = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
            .and_then(|ns| Ok((ns, std::fs::metadata(format!("/proc/{pid}/root"))?)));
        let (ns, engine_root) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                return EngineView::Unseen(format!(
                    "the engine's mount namespace cannot be opened: {e}"
                ));
            }
        };
        let view = EngineView::Entered(Arc::new(OwnedFd::from(ns)));
        match view.run(|| std::fs::metadata("/")).and_then(|root| root) {
            Ok(root) if (root.dev(), root.ino()) == (engine_root.dev(), engine_root.ino()) => view,
            Ok(_) => EngineView::Unseen("the engine runs chrooted in its mount namespace".into()),
            Err(e) => EngineView::Unseen(format!(
                "the engine's mount namespace cannot be entered: {e}"
            )),
        }
    }

    /// Whether mounts can be made where the engine sees them.
    pub fn sees_gathered(&self) -> bool {
        !matches!(self, EngineView::Unseen(_))
    }

    /// `work`, done where the engine sees its mounts: here, or in a thread of its own (a
    /// thread that shares no filesystem context) that entered the engine's namespace.
    pub fn run<R: Send>(&self, work: impl FnOnce() -> R + Send) -> io::Result<R> {
        match self {
            EngineView::Shared => Ok(work()),
            EngineView::Entered(ns) => std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        sys::enter_mount_ns(&ns.as_fd())?;
                        Ok(work())
                    })
                    .join()
                    .unwrap_or_else(|_| {
                        Err(io::Error::other(
                            "the thread in the engine's mount namespace panicked",
                        ))
                    })
            }),
            EngineView::Unseen(why) => Err(io::Error::other(why.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process is an engine that shares its own namespace; a pid the kernel could not
    /// give, or one that names no process, leaves the engine unseen, and nothing runs there.
    #[test]
    fn the_engines_view_follows_what_its_pid_shows() {
        let own = i32::try_from(std::process::id()).ok();
        let view = EngineView::of(own);
        assert!(matches!(view, EngineView::Shared), "{view:?}");
        assert_eq!(view.run(|| 7).unwrap(), 7);
        for pid in [None, Some(0), Some(i32::MAX)] {
            let view = EngineView::of(pid);
            assert!(!view.sees_gathered(), "{pid:?}: {view:?}");
            assert!(view.run(|| ()).is_err());
        }
    }
}
