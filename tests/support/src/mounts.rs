//! Observing the host: its mount table and the contents of a rootfs.

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

/// Lines of the host's mount table that mention any of `paths`: a container
/// that was deleted must leave none behind (nothing may propagate back).
pub fn host_mounts_referencing(paths: &[&Path]) -> Vec<String> {
    let table = fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    let needles: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    table
        .lines()
        .filter(|line| needles.iter().any(|needle| line.contains(needle.as_str())))
        .map(str::to_owned)
        .collect()
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
