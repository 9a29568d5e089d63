//! Device programs kept loaded between containers, pinned in a bpffs directory under a name
//! made from their instructions.
//!
//! Loading a program is most of the cgroup v2 step: the kernel verifies and compiles each one.
//! Containers whose runtime program and GPU rules are the same, the usual case on a node, would
//! each load the same program. A kept one is attached instead, and only when the kernel lists
//! it as that program, instruction for instruction; anything else under its name is removed.
//! Removing a pin changes no container: a cgroup holds the program attached to it.

use super::insn::{Insn, encode_program};
use super::sys;
use nvhook_model::stable_hash::fnv1a;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// bpffs, the only filesystem that holds pins.
const BPF_FS_MAGIC: u32 = libc::BPF_FS_MAGIC as u32;
/// The most programs the directory keeps; past it the oldest go. Each holds a little kernel
/// memory until it is removed or the node reboots.
const LIMIT: usize = 64;

/// Whether device programs are kept in a directory, as `nvhook doctor` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keeping {
    /// Its parent is a bpffs; so many programs are there now (none before the first is kept).
    Kept(usize),
    /// Its parent is not a bpffs: each container loads its own program.
    NoBpffs,
}

/// What [`KeptPrograms::open`] would find at `dir`, without making it.
pub fn keeping(dir: &Path) -> Keeping {
    if !crate::on_filesystem(dir.parent().unwrap_or(dir), BPF_FS_MAGIC) {
        return Keeping::NoBpffs;
    }
    Keeping::Kept(std::fs::read_dir(dir).map_or(0, Iterator::count))
}

/// A bpffs directory of root's, where nvhook keeps device programs.
pub(crate) struct KeptPrograms {
    dir: PathBuf,
}

impl KeptPrograms {
    /// The directory `dir`, made if it is missing, where its parent is a bpffs. None (logged)
    /// where programs cannot be kept there: each container then loads its own.
    pub(crate) fn open(dir: &Path) -> Option<KeptPrograms> {
        let usable = || -> Result<(), String> {
            // Made once, by the first start that finds it missing; every start checks it.
            let meta = match std::fs::symlink_metadata(dir) {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let parent = dir.parent().unwrap_or(dir);
                    if !crate::on_filesystem(parent, BPF_FS_MAGIC) {
                        return Err(format!("{} is not a bpffs mount", parent.display()));
                    }
                    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(format!("mkdir: {e}")),
                    }
                    std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?
                }
                Err(e) => return Err(e.to_string()),
            };
            // SAFETY: geteuid has no preconditions.
            let euid = unsafe { libc::geteuid() };
            if !meta.is_dir() || meta.uid() != euid || meta.mode() & 0o022 != 0 {
                return Err("not a directory of this user's that only it can write".into());
            }
            if !crate::on_filesystem(dir, BPF_FS_MAGIC) {
                return Err("not on the bpffs".into());
            }
            Ok(())
        };
        match usable() {
            Ok(()) => Some(KeptPrograms {
                dir: dir.to_owned(),
            }),
            Err(why) => {
                tracing::debug!(dir = %dir.display(), why, "device programs are not kept");
                None
            }
        }
    }

    /// The kept program that the kernel lists as `insns`.
    pub(crate) fn get(&self, insns: &[Insn]) -> Option<OwnedFd> {
        let path = self.dir.join(name(insns));
        let program = match sys::pinned(&c_path(&path)?) {
            Ok(program) => program,
            Err(e) => {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::debug!(path = %path.display(), error = %e, "cannot open a kept device program");
                }
                return None;
            }
        };
        match sys::program_listing(program.as_fd()) {
            Ok((sys::BPF_PROG_TYPE_CGROUP_DEVICE, listed)) if listed == insns => Some(program),
            _ => {
                tracing::warn!(
                    path = %path.display(),
                    "the kept device program is not the one its name stands for: removed"
                );
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Keeps `program`, loaded from `insns`, for the containers after this one, where the
    /// kernel lists it as `insns` (so that [`KeptPrograms::get`] can find it), and takes the
    /// directory back to [`LIMIT`] programs.
    pub(crate) fn keep(&self, insns: &[Insn], program: BorrowedFd<'_>) {
        match sys::program_listing(program) {
            Ok((_, listed)) if listed == insns => {}
            _ => {
                tracing::debug!(
                    "the kernel lists the device program as other instructions: not kept"
                );
                return;
            }
        }
        let name = name(insns);
        let path = self.dir.join(&name);
        let Some(c) = c_path(&path) else {
            return;
        };
        match sys::pin(program, &c) {
            Ok(()) => {}
            // Another start kept it meanwhile.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "cannot keep the device program");
                return;
            }
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let dated = entries
            .filter_map(Result::ok)
            .filter_map(|e| Some((e.file_name(), e.metadata().ok()?.modified().ok()?)))
            .collect();
        for old in oldest_beyond(dated, LIMIT, OsStr::new(&name)) {
            let _ = std::fs::remove_file(self.dir.join(old));
        }
    }
}

fn c_path(path: &Path) -> Option<CString> {
    CString::new(path.as_os_str().as_encoded_bytes()).ok()
}

/// A program's name in the directory: its instructions' hash and count (bpffs refuses a name
/// with a dot).
fn name(insns: &[Insn]) -> String {
    format!(
        "devices_{:016x}_{}",
        fnv1a(encode_program(insns)),
        insns.len()
    )
}

/// The entries to remove so that `limit` remain, oldest first, never `new`.
fn oldest_beyond(
    mut entries: Vec<(OsString, SystemTime)>,
    limit: usize,
    new: &OsStr,
) -> Vec<OsString> {
    let excess = entries.len().saturating_sub(limit);
    entries.retain(|(name, _)| name != new);
    entries.sort_by_key(|&(_, time)| time);
    entries.into_iter().take(excess).map(|(n, _)| n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceKind;
    use crate::bpf::interp::runc_program;
    use std::time::Duration;

    #[test]
    fn a_name_stands_for_every_instruction_and_has_no_dot() {
        let null = runc_program(&[(DeviceKind::Char, Some(1), Some(3), "rwm")], false);
        let zero = runc_program(&[(DeviceKind::Char, Some(1), Some(5), "rwm")], false);
        assert_eq!(null.len(), zero.len());
        assert_ne!(name(&null), name(&zero));
        assert_eq!(name(&null), name(&null.clone()));
        assert!(!name(&null).contains('.'), "{}", name(&null));
        assert!(name(&null).ends_with(&format!("_{}", null.len())));
    }

    #[test]
    fn the_oldest_go_first_and_never_the_new_one() {
        let at = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let entries = vec![
            ("c".into(), at(3)),
            ("new".into(), at(0)),
            ("a".into(), at(1)),
            ("b".into(), at(2)),
        ];
        assert_eq!(
            oldest_beyond(entries.clone(), 2, OsStr::new("new")),
            ["a", "b"]
        );
        assert_eq!(oldest_beyond(entries.clone(), 3, OsStr::new("new")), ["a"]);
        assert!(oldest_beyond(entries, 4, OsStr::new("new")).is_empty());
    }
}
