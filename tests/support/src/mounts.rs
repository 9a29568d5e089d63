//! Observing the host: its mount table and the contents of a rootfs.

use crate::cmd::{require_program, run_checked};
use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

/// A bpffs of its own on a temporary directory of the host, detached when dropped: where a
/// test's hooks keep their device programs (`device-program-pins`), seen through every
/// private mount namespace made after it.
pub struct Bpffs {
    dir: tempfile::TempDir,
}

impl Bpffs {
    pub fn mount() -> Bpffs {
        let dir = tempfile::tempdir().expect("a dir for a bpffs");
        run_checked(
            Command::new(require_program("mount"))
                .args(["-t", "bpf", "bpf"])
                .arg(dir.path()),
        );
        Bpffs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The names in its directory `name`, sorted; none where it is not there.
    pub fn entries(&self, name: &str) -> Vec<String> {
        let Ok(entries) = fs::read_dir(self.path().join(name)) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .map(|e| {
                e.expect("a bpffs entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        crate::engines::unmount_below(self.dir.path());
    }
}

/// Lines of the host's mount table that mention any of `paths`: a container
/// that was deleted must leave none behind (nothing may propagate back).
pub fn host_mounts_referencing(paths: &[&Path]) -> Vec<String> {
    let table = fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    let needles: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    table
        .lines()
        .filter(|line| !kept_by_the_node(line))
        .filter(|line| needles.iter().any(|needle| line.contains(needle.as_str())))
        .map(str::to_owned)
        .collect()
}

/// Whether a mount table line is one of the trees the CDI hook keeps on a node between
/// containers (`hook-trees` beside NVML's cached answer, unmounted with the node): the node's
/// state, not a mount a container left.
pub fn kept_by_the_node(line: &str) -> bool {
    line.split(' ')
        .nth(4)
        .is_some_and(|point| point.contains("/hook-trees"))
}

/// A sorted description of every entry under `root` (type, mode, size, link
/// target), without following symlinks, to prove a rootfs was left untouched.
pub fn tree_listing(root: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    list_into(root, root, &mut lines);
    lines.sort();
    lines
}

fn list_into(root: &Path, dir: &Path, lines: &mut Vec<String>) {
    let entries =
        fs::read_dir(dir).unwrap_or_else(|err| panic!("read_dir {}: {err}", dir.display()));
    for entry in entries {
        let path = entry.expect("read_dir entry").path();
        let meta = fs::symlink_metadata(&path).expect("lstat");
        let rel = path.strip_prefix(root).expect("entry under root").display();
        let mode = meta.permissions().mode();
        let kind = meta.file_type();
        let line = if kind.is_symlink() {
            let target = fs::read_link(&path).expect("readlink");
            format!("{rel} link -> {}", target.display())
        } else if kind.is_dir() {
            format!("{rel} dir {mode:o}")
        } else if kind.is_file() {
            format!("{rel} file {mode:o} {}", meta.len())
        } else if kind.is_char_device() || kind.is_block_device() {
            format!("{rel} device {mode:o}")
        } else {
            format!("{rel} other {mode:o}")
        };
        lines.push(line);
        if kind.is_dir() {
            list_into(root, &path, lines);
        }
    }
}
