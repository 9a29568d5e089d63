//! The driver's files of each driver directory an image searches
//! ([`crate::plan::driver_dirs`]), gathered into one directory where the engine sees it, so
//! that the runtime makes one recursive bind mount where it would make one per file: runc's
//! own work per bind mount is most of what NRI's `mounts` mode costs a start
//! (docs/performance.md).
//!
//! The directories are [`crate::hook::gathered`]'s, in `driver-dirs` in the plugin's state
//! directory, mounted in the engine's mount namespace ([`super::engine_view`]) and unmounted
//! when the plugin stops.

use super::engine_view::EngineView;
use crate::hook::gathered::{Contents, GatherError, OpenStore, Store};
use crate::rootfs::sys;
use std::path::{Path, PathBuf};

/// The tmpfs's name in nvhook's state directory.
pub const DIR_NAME: &str = "driver-dirs";

/// The gathered directories under `state_dir`, mounted on first use, where the engine sees
/// them.
pub struct DriverTrees {
    store: Store,
    view: EngineView,
}

impl DriverTrees {
    pub fn new(state_dir: &Path, view: EngineView) -> DriverTrees {
        DriverTrees {
            store: Store::new(state_dir.join(DIR_NAME)),
            view,
        }
    }

    /// The directory holding each of `sets` (each file a name and its host source), in order,
    /// each made once; all of them in one visit to the engine's mount namespace, whose entry
    /// is the error when it fails.
    pub fn gather(
        &self,
        sets: &[&[(&str, &Path)]],
    ) -> Result<Vec<Result<PathBuf, GatherError>>, GatherError> {
        let entered = self.view.run(|| {
            let store = self.store.open()?;
            if store.mounted {
                MOUNTED
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((self.store.root().to_path_buf(), self.view.clone()));
            }
            Ok(sets.iter().map(|files| gather_one(&store, files)).collect())
        });
        entered.map_err(|source| GatherError::Io {
            op: "enter the engine's mount namespace for",
            path: self.store.root().to_path_buf(),
            source,
        })?
    }
}

/// One set of [`DriverTrees::gather`], in the engine's mount namespace.
fn gather_one(store: &OpenStore, files: &[(&str, &Path)]) -> Result<PathBuf, GatherError> {
    let gathered = store.gather(&Contents {
        files: files.to_vec(),
        links: Vec::new(),
    })?;
    if gathered.made {
        tracing::info!(dir = %gathered.path.display(), files = files.len(), "NRI: driver files gathered into one directory");
    }
    Ok(gathered.path)
}

/// The tmpfs this process mounted, and where, for [`detach_all`].
static MOUNTED: std::sync::Mutex<Vec<(PathBuf, EngineView)>> = std::sync::Mutex::new(Vec::new());

/// Unmounts the gathered directories this process made (the plugin is stopping). Running
/// containers keep their own copies.
pub fn detach_all() {
    let mounted = std::mem::take(&mut *MOUNTED.lock().unwrap_or_else(|e| e.into_inner()));
    for (root, view) in mounted {
        if let Ok(Ok(())) = view.run(|| sys::unmount_lazily(&root)) {
            tracing::info!(dir = %root.display(), "NRI: gathered driver directories unmounted");
        }
    }
}
