//! The hook arguments of a CDI spec written to a file, kept in a file beside the spec.
//!
//! nvhook's createRuntime hook carries the driver's files, links and loader-cache entries as
//! arguments: about 80 of them and 6 KB with every capability. An engine copies them into the
//! OCI spec of every container it gives a device of the spec, and the engine, its shim and the
//! runtime store, pass and parse that spec several times for each start, which costs each start
//! far more than its size suggests (docs/performance.md, thirty-ninth round). So a spec written
//! to a file names them instead: `--args-file PATH SUM`, where PATH is a file beside the spec
//! holding one argument a line, and SUM the FNV-1a of its text, which the hook checks: a start
//! through a spec gets exactly the arguments the spec was written with, or none.
//!
//! The file's name holds the sum (`.NAME.SUM.args` beside spec NAME), so a spec written again
//! with other arguments names another file. The file of the spec it replaces is kept, since a
//! container made through that spec (a stopped Podman container) may start again; older ones
//! are removed. Engines read only `*.json` and `*.yaml` files of their spec directories, so the
//! file is no spec to them. The hook reads it only where it and its directory are writable by
//! their owner alone, who is root, the hook's own user, or in a rootless engine's user
//! namespace an owner the namespace does not map (root's, as the engine's user sees it).
//!
//! Edits made for one container at a time, which no spec file holds (the NRI plugin's and
//! nvhook-runtime's `cdi` modes), keep theirs in nvhook's state directory ([`kept`]).

use crate::atomic_file::{NewFile, write_atomic};
use crate::delivery::cdi_spec::{CdiSpec, ContainerEdits};
use std::borrow::Cow;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The hook's flag that names the file.
pub const FLAG: &str = "--args-file";

/// The GPU layout stamp stays among the spec's own arguments: it changes with the GPUs' MIG
/// instances, and a refresh for a new layout then keeps the file it had.
const KEPT_INLINE: &str = "--gpu-layout";

/// More than any spec's arguments; the hook reads no more.
const MAX_LEN: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ArgsFileError {
    #[error(
        "bad CDI hook argument {FLAG} (expected {FLAG} PATH SUM: an absolute path and 16 hex digits); regenerate the CDI spec with this nvhook"
    )]
    Usage,
    #[error(
        "cannot read the CDI hook's argument file {}: {source}; the spec that names it was replaced: run `nvhook cdi refresh` (or `nvhook cdi generate` for a spec kept elsewhere) and start the container again; a file of nvhook's state directory (hook-args) is written again when the container is created again",
        path.display()
    )]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the CDI hook's argument file {} is not used: {reason}; only root (or the engine's own user) may write it and its directory, as the spec's",
        path.display()
    )]
    Untrusted { path: PathBuf, reason: &'static str },
    #[error(
        "the CDI hook's argument file {} does not hold the arguments its spec was written with (sum {found}, the spec names {expected}): run `nvhook cdi refresh` (or `nvhook cdi generate` for a spec kept elsewhere) and start the container again",
        path.display()
    )]
    Mismatch {
        path: PathBuf,
        expected: String,
        found: String,
    },
}

/// The arguments moved out of a spec: the file they go to and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgsFile {
    pub path: PathBuf,
    text: String,
}

impl ArgsFile {
    /// Writes the file, readable by all as the spec is, unless it holds its text already.
    pub fn write(&self) -> std::io::Result<()> {
        if std::fs::read(&self.path).is_ok_and(|bytes| bytes == self.text.as_bytes()) {
            return Ok(());
        }
        write_atomic(&self.path, self.text.as_bytes(), NewFile::mode(0o644))
    }
}

/// Sixteen hex digits of the FNV-1a of `text`.
fn sum(text: &str) -> String {
    format!("{:016x}", nvhook_model::stable_hash::fnv1a(text.bytes()))
}

/// Moves the arguments of `spec`'s nvhook hook (its `createRuntime` hook's, after `hook
/// createRuntime`) but the GPU layout stamp into the file for them beside the spec at
/// `spec_path` (absolute), and names that file in their place. `None`, and the spec as it was,
/// where it has no such hook or an argument holds a line break.
pub fn externalize(spec: &mut CdiSpec, spec_path: &Path) -> Option<ArgsFile> {
    let name = spec_path.file_name()?.to_str()?;
    move_out(&mut spec.container_edits, |sum| {
        spec_path.with_file_name(format!(".{name}.{sum}.args"))
    })
}

/// [`externalize`] for `edits` whose file is at the path `path_for` gives for the sum of its
/// text.
fn move_out(
    edits: &mut ContainerEdits,
    path_for: impl FnOnce(&str) -> PathBuf,
) -> Option<ArgsFile> {
    let hook = (edits.hooks.iter_mut()).find(|h| h.hook_name == "createRuntime")?;
    let start =
        2 + (hook.args.windows(2)).position(|w| w[0] == "hook" && w[1] == "createRuntime")?;
    let tail = &hook.args[start..];
    if tail.is_empty() || tail.iter().any(|a| a.contains('\n')) {
        return None;
    }
    let (mut text, mut kept) = (String::new(), Vec::new());
    let mut it = hook.args.split_off(start).into_iter();
    while let Some(arg) = it.next() {
        if arg == KEPT_INLINE {
            kept.push(arg);
            kept.extend(it.next());
        } else {
            text.push_str(&arg);
            text.push('\n');
        }
    }
    let sum = sum(&text);
    let path = path_for(&sum);
    hook.args
        .extend([FLAG.to_string(), path.display().to_string(), sum]);
    hook.args.extend(kept);
    Some(ArgsFile { path, text })
}

/// The argument file a spec's `text` names, if it names one beside the spec at `spec_path`.
pub fn named_in(text: &str, spec_path: &Path) -> Option<PathBuf> {
    let name = spec_path.file_name()?.to_str()?;
    let prefix = spec_path.with_file_name(format!(".{name}."));
    let prefix = prefix.to_str()?;
    let at = text.find(prefix)? + prefix.len();
    let rest = text.get(at..)?;
    let digits = rest.get(..16)?;
    (digits.bytes().all(|b| b.is_ascii_hexdigit()) && rest[16..].starts_with(".args"))
        .then(|| PathBuf::from(format!("{prefix}{digits}.args")))
}

/// Removes the argument files of the spec at `spec_path` but those in `keep`; the paths
/// removed.
pub fn remove_others(spec_path: &Path, keep: &[&Path]) -> std::io::Result<Vec<PathBuf>> {
    let (Some(dir), Some(name)) = (
        spec_path.parent(),
        spec_path.file_name().and_then(|n| n.to_str()),
    ) else {
        return Ok(Vec::new());
    };
    let prefix = format!(".{name}.");
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let ours = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(&prefix)?.strip_suffix(".args"))
            .is_some_and(|sum| sum.len() == 16 && sum.bytes().all(|b| b.is_ascii_hexdigit()));
        if ours && !keep.contains(&path.as_path()) {
            std::fs::remove_file(&path)?;
            removed.push(path);
        }
    }
    Ok(removed)
}

/// `args` with `--args-file PATH SUM` replaced by the arguments in PATH, checked against SUM.
pub fn inline(args: &[String]) -> Result<Cow<'_, [String]>, ArgsFileError> {
    let Some(at) = args.iter().position(|a| a == FLAG) else {
        return Ok(Cow::Borrowed(args));
    };
    let (path, expected) = match (args.get(at + 1), args.get(at + 2)) {
        (Some(path), Some(expected))
            if path.starts_with('/')
                && expected.len() == 16
                && expected.bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            (Path::new(path), expected)
        }
        _ => return Err(ArgsFileError::Usage),
    };
    let text = read_trusted(path)?;
    let found = sum(&text);
    if found != *expected {
        return Err(ArgsFileError::Mismatch {
            path: path.into(),
            expected: expected.clone(),
            found,
        });
    }
    let mut out = args[..at].to_vec();
    if let Some(lines) = text.strip_suffix('\n') {
        out.extend(lines.split('\n').map(String::from));
    }
    out.extend_from_slice(&args[at + 3..]);
    Ok(Cow::Owned(out))
}

/// Writable by its owner alone, who is root, this process's user, or, in a user namespace
/// (a rootless engine's), a user of the host the namespace does not map: the spec's own
/// owner as the engine's user sees it, root's spec directories included.
fn trusted(meta: &std::fs::Metadata) -> bool {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let owner = meta.uid();
    meta.mode() & 0o022 == 0
        && (owner == 0 || owner == euid || (owner == overflow_uid() && in_user_namespace()))
}

/// The uid the kernel shows for an owner the user namespace does not map.
fn overflow_uid() -> u32 {
    crate::whole_file::read_kernel_text(Path::new("/proc/sys/kernel/overflowuid"))
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(65534)
}

/// Whether this process's user namespace maps less than every uid (it is not the host's).
fn in_user_namespace() -> bool {
    crate::whole_file::read_kernel_text(Path::new("/proc/self/uid_map"))
        .is_ok_and(|map| map.split_whitespace().collect::<Vec<_>>() != ["0", "0", "4294967295"])
}

fn read_trusted(path: &Path) -> Result<String, ArgsFileError> {
    let read = |source| ArgsFileError::Read {
        path: path.into(),
        source,
    };
    let untrusted = |reason| ArgsFileError::Untrusted {
        path: path.into(),
        reason,
    };
    let dir = std::fs::metadata(path.parent().unwrap_or(Path::new("/"))).map_err(read)?;
    if !trusted(&dir) {
        return Err(untrusted("others may write its directory"));
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(read)?;
    let meta = file.metadata().map_err(read)?;
    if !meta.is_file() {
        return Err(untrusted("it is not a regular file"));
    }
    if !trusted(&meta) {
        return Err(untrusted("others may write it"));
    }
    if meta.len() > MAX_LEN {
        return Err(untrusted("it is larger than any spec's arguments"));
    }
    let bytes = crate::whole_file::read_sized(&mut file, meta.len()).map_err(read)?;
    String::from_utf8(bytes)
        .map_err(|e| read(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

pub mod kept;

#[cfg(test)]
mod tests;
