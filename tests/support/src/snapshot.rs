//! Snapshots of what a hostile image aims at outside its rootfs: a canary tree, and the
//! host's own copies of the places the hook writes to inside a container.

use std::collections::BTreeMap;
use std::fs;
use std::hash::{DefaultHasher, Hasher};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// Path -> a description of the entry: kind, mode, owner, size, mtime, inode, link target
/// and, for regular files, a hash of the content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot(BTreeMap<String, String>);

impl Snapshot {
    /// Every entry under `root` (and `root` itself), not following links.
    pub fn tree(root: &Path) -> Snapshot {
        let mut map = BTreeMap::new();
        walk(root, &mut map);
        Snapshot(map)
    }

    /// Keeps only the paths `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.0.retain(|path, _| keep(path));
    }

    /// What changed, one line per path.
    pub fn diff(&self, after: &Snapshot) -> Vec<String> {
        let mut keys: Vec<&String> = self.0.keys().chain(after.0.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter_map(|k| {
                let (a, b) = (self.0.get(k), after.0.get(k));
                (a != b).then(|| format!("{k}: {a:?} -> {b:?}"))
            })
            .collect()
    }
}

/// Host files an escaping write would change, described in full.
const HOST_FILES: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/debian_version",
    "/usr/bin/true",
];

/// Host directories, with the names (substrings) of the entries watched in each: what the
/// hook would create there had it followed a link out of the rootfs. Empty: every entry.
/// Only driver-like names, so that unrelated activity on the machine does not count.
const HOST_DIRS: &[(&str, &[&str])] = &[
    ("/", &["nvidia", "nvhook", "canary"]),
    ("/etc", &["nvidia", "nvhook", "ld.so", "vulkan"]),
    ("/etc/ld.so.conf.d", &[]),
    ("/etc/vulkan", &[]),
    ("/usr/bin", &["nvidia", "nvhook"]),
    ("/usr/lib", &["nvidia", "cuda", "nvhook", "firmware"]),
    (
        "/usr/lib/x86_64-linux-gnu",
        &["nvidia", "cuda", "nvcuvid", "nvoptix", "nvhook"],
    ),
    ("/usr/lib/i386-linux-gnu", &["nvidia", "cuda", "nvhook"]),
    ("/usr/lib32", &[]),
    ("/usr/lib64", &["nvidia", "cuda", "nvhook"]),
    ("/usr/share/glvnd", &[]),
    ("/lib/firmware", &["nvidia"]),
    ("/run", &["nvidia", "nvhook"]),
    ("/dev", &["nvidia"]),
    ("/tmp", &["nvidia-mps"]),
];

/// Where nvhook itself writes on the host on every start, by its own code and before it
/// touches a container: the configs it keeps parsed for the next process. Any hook of the run
/// (of this test or one running beside it) may add or replace one there.
const NVHOOK_OWN: &str = "/run/nvhook/config";

/// The host's side of every target a hostile image aims at.
pub fn host_snapshot() -> Snapshot {
    let mut map = BTreeMap::new();
    for file in HOST_FILES {
        map.insert(file.to_string(), describe(Path::new(file)));
    }
    for (dir, needles) in HOST_DIRS {
        let Ok(entries) = fs::read_dir(dir) else {
            map.insert(dir.to_string(), "absent or unreadable".into());
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if needles.is_empty() || needles.iter().any(|n| name.contains(n)) {
                let path = entry.path();
                walk(&path, &mut map);
            }
        }
    }
    let mut snapshot = Snapshot(map);
    snapshot.retain(|path| !Path::new(path).starts_with(NVHOOK_OWN));
    snapshot
}

fn walk(path: &Path, map: &mut BTreeMap<String, String>) {
    map.insert(path.display().to_string(), describe(path));
    let is_dir = fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
    if is_dir && let Ok(entries) = fs::read_dir(path) {
        for entry in entries.flatten() {
            walk(&entry.path(), map);
        }
    }
}

fn describe(path: &Path) -> String {
    let Ok(m) = fs::symlink_metadata(path) else {
        return "absent".into();
    };
    let common = format!(
        "mode {:o} owner {}:{} mtime {}.{:09} ino {}",
        m.mode(),
        m.uid(),
        m.gid(),
        m.mtime(),
        m.mtime_nsec(),
        m.ino()
    );
    let kind = m.file_type();
    if kind.is_symlink() {
        let target = fs::read_link(path).map(|t| t.display().to_string());
        format!("link -> {} {common}", target.unwrap_or_default())
    } else if kind.is_dir() {
        format!("dir {common}")
    } else if kind.is_file() {
        let mut h = DefaultHasher::new();
        h.write(&fs::read(path).unwrap_or_default());
        format!("file size {} hash {:x} {common}", m.len(), h.finish())
    } else if kind.is_char_device() || kind.is_block_device() {
        format!("device {:x} {common}", m.rdev())
    } else {
        format!("special {common}")
    }
}
