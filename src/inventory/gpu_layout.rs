//! Which GPUs the driver has bound and which MIG instances they hold, as the driver's procfs
//! shows them: what a static CDI spec's device names and nodes stand for. A GPU bound or
//! unbound, MIG turned on or off, or its instances made anew change it; a reboot into the same
//! GPUs and MIG layout, or the module rebuilt for a new kernel, does not.
//!
//! Its [`stamp`](GpuLayout::stamp) goes into the hook of the specs nvhook
//! writes, so that a start through a spec written for another layout (a MIG reconfiguration
//! not yet followed by `nvhook cdi refresh`) is refused, instead of giving the container
//! whatever the stale names now point at.

use crate::config::Config;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuLayout {
    /// Bus ids under `<proc-root>/driver/nvidia/gpus`.
    pub gpus: Vec<String>,
    /// Every path under `<proc-root>/driver/nvidia/capabilities`: MIG mode and the GPU and
    /// compute instances of each GPU.
    pub capabilities: Vec<String>,
}

impl GpuLayout {
    /// The layout now; a directory that cannot be read adds nothing.
    pub fn read(config: &Config) -> GpuLayout {
        let nvidia = config.proc_path("driver/nvidia");
        GpuLayout {
            gpus: names_under(&nvidia.join("gpus"), false),
            capabilities: names_under(&nvidia.join("capabilities"), true),
        }
    }

    /// Whether the driver's procfs showed any GPU: a layout without one cannot be told from
    /// a procfs that is not the host's, and stamps nothing.
    pub fn has_gpus(&self) -> bool {
        !self.gpus.is_empty()
    }

    /// Sixteen hex digits naming this layout: FNV-1a (64 bits) of its entries, a hash with a
    /// fixed definition, so that a spec one nvhook build wrote is checked the same by the next.
    pub fn stamp(&self) -> String {
        let lists = [&self.gpus, &self.capabilities];
        // Separators that no name holds keep ("a", "bc") and ("ab", "c") apart.
        let bytes = lists.into_iter().enumerate().flat_map(|(i, list)| {
            list.iter()
                .flat_map(|name| name.bytes().chain([0]))
                .chain([0xff, i as u8])
        });
        format!("{:016x}", nvhook_model::stable_hash::fnv1a(bytes))
    }

    /// Whether `text` has the shape of a [`stamp`](GpuLayout::stamp).
    pub fn is_stamp(text: &str) -> bool {
        text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit())
    }
}

/// The sorted entry names under `dir` (paths relative to it, the whole tree with `deep`);
/// none when it does not exist.
fn names_under(dir: &Path, deep: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(dir.join(&rel)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = rel.join(entry.file_name());
            if deep && entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(path.clone());
            }
            out.push(path.to_string_lossy().into_owned());
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(gpus: &[&str], capabilities: &[&str]) -> GpuLayout {
        let owned = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        GpuLayout {
            gpus: owned(gpus),
            capabilities: owned(capabilities),
        }
    }

    #[test]
    fn the_stamp_is_fixed_by_its_definition() {
        // FNV-1a of nothing but the two lists' ends: computed by hand from the definition, so
        // that a change of the hash (which would refuse every spec already written) fails here.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in [0xff, 0, 0xff, 1] {
            hash = (hash ^ byte).wrapping_mul(0x100_0000_01b3);
        }
        assert_eq!(GpuLayout::default().stamp(), format!("{hash:016x}"));
        assert!(GpuLayout::is_stamp(&GpuLayout::default().stamp()));
        assert!(!GpuLayout::is_stamp("/usr/bin"));
    }

    #[test]
    fn a_mig_change_or_a_gpu_gone_changes_the_stamp() {
        let gpus = ["0000:3b:00.0", "0000:86:00.0"];
        let mig = ["gpu0", "gpu0/mig", "gpu0/mig/gi1", "gpu0/mig/gi1/ci0"];
        let before = layout(&gpus, &mig).stamp();
        assert_eq!(before, layout(&gpus, &mig).stamp());
        let remade = ["gpu0", "gpu0/mig", "gpu0/mig/gi2", "gpu0/mig/gi2/ci0"];
        assert_ne!(before, layout(&gpus, &remade).stamp());
        assert_ne!(before, layout(&gpus[..1], &mig).stamp());
        // A name moved from one list to the other is another layout.
        assert_ne!(
            layout(&["a"], &["bc"]).stamp(),
            layout(&["ab"], &["c"]).stamp()
        );
        assert_ne!(
            layout(&["a", "b"], &[]).stamp(),
            layout(&["a"], &["b"]).stamp()
        );
    }
}
