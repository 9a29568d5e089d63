//! The hook arguments of edits made for one container at a time (the NRI plugin's `cdi` mode,
//! nvhook-runtime's `cdi` mode), kept in nvhook's state directory. Such edits have no spec
//! file to keep their arguments beside, and inline they cost each start what a spec's did
//! (docs/performance.md, thirty-ninth and forty-second rounds): the engine stores and passes
//! the container's OCI spec, and the runtime parses it, several times a start.
//!
//! A file is named by the sum of its text (`hook-args/SUM.args` beside NVML's cached answer),
//! so the containers of one request share it and a start whose file is there writes nothing.
//! Using a file marks it used (its time); writing a new one removes those no start used for
//! [`UNUSED_FOR`], so a node's directory holds the requests of the last while. The directory's
//! lock keeps that removal from taking a file another process has just found and marked.

use super::{ArgsFile, move_out, trusted};
use crate::atomic_file::{NewFile, write_atomic};
use crate::config::Config;
use crate::delivery::cdi_spec::ContainerEdits;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The directory's name beside NVML's cached answer.
pub const DIR_NAME: &str = "hook-args";

/// How long a file no start used stays. A container's hook reads its file as the runtime
/// creates the container, right after the edits are made; a file is written again where a
/// later start finds it gone.
const UNUSED_FOR: Duration = Duration::from_secs(60 * 60);

/// Moves the arguments of `edits`' nvhook hook into their file in the state directory beside
/// NVML's cached answer, written there unless it is there already. Where nvhook keeps nothing
/// between starts (`nvml-cache-file = ""`) or the file cannot be had, the edits stay as they
/// were, with their arguments inline, and the reason is logged.
pub fn externalize(edits: &mut ContainerEdits, config: &Config) {
    let Some(dir) = config.nvml_cache().and_then(Path::parent) else {
        return;
    };
    let dir = dir.join(DIR_NAME);
    let inline = edits.hooks.clone();
    let Some(file) = move_out(edits, |sum| dir.join(format!("{sum}.args"))) else {
        return;
    };
    if let Err(e) = keep(&dir, &file) {
        tracing::info!(dir = %dir.display(), "the hook's arguments stay in the container's spec: {e}");
        edits.hooks = inline;
    }
}

/// `file` in `dir`: marked used where it is there, else written, removing what no start used
/// for [`UNUSED_FOR`].
fn keep(dir: &Path, file: &ArgsFile) -> io::Result<()> {
    let dir_file = open_dir(dir)?;
    let name = CString::new(file.path.file_name().unwrap_or_default().as_bytes())
        .map_err(io::Error::other)?;
    let lock = |op| -> io::Result<()> {
        // SAFETY: flock on a descriptor this function owns.
        match unsafe { libc::flock(dir_file.as_raw_fd(), op) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    };
    lock(libc::LOCK_SH)?;
    // SAFETY: a descriptor this function owns, a NUL-terminated name, and no times (now).
    let marked = unsafe {
        libc::utimensat(
            dir_file.as_raw_fd(),
            name.as_ptr(),
            std::ptr::null(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if marked == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.kind() != io::ErrorKind::NotFound {
        return Err(err);
    }
    lock(libc::LOCK_UN)?;
    write_atomic(&file.path, file.text.as_bytes(), NewFile::mode(0o644))?;
    lock(libc::LOCK_EX)?;
    let removed = remove_unused(dir, &file.path, SystemTime::now());
    if removed > 0 {
        tracing::info!(removed, dir = %dir.display(), "hook argument files no start used for an hour removed");
    }
    Ok(())
}

/// The directory, made root's alone where it is not there (the hook runs with umask 0), and
/// refused where others may write it: the hook would refuse its files.
fn open_dir(dir: &Path) -> io::Result<File> {
    let open = || File::open(dir);
    let dir_file = match open() {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
            open()?
        }
        Err(e) => return Err(e),
    };
    match trusted(&dir_file.metadata()?) {
        true => Ok(dir_file),
        false => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "others may write it, so the hook would not read its files",
        )),
    }
}

/// Removes the files in `dir` but `keep` that no start used before `now` − [`UNUSED_FOR`]
/// (and temporary files left that long); how many.
fn remove_unused(dir: &Path, keep: &Path, now: SystemTime) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let unused = |path: &PathBuf| {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return false;
        };
        let idle = meta
            .modified()
            .ok()
            .and_then(|at| now.duration_since(at).ok());
        meta.is_file() && path != keep && idle.is_some_and(|idle| idle > UNUSED_FOR)
    };
    (entries.flatten().map(|entry| entry.path()))
        .filter(unused)
        .filter(|path| std::fs::remove_file(path).is_ok())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::args_file::tests::edits_with as edits;
    use crate::delivery::args_file::{FLAG, inline};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn config(state: &Path) -> Config {
        Config {
            nvml_cache_file: state.join("nvml-inventory.json"),
            ..Config::default()
        }
    }

    const ARGS: [&str; 4] = [
        "--bind-files",
        "/usr/lib/x86_64-linux-gnu",
        "libcuda.so.580.95.05,libnvidia-ml.so.580.95.05",
        "--links",
    ];

    fn file_named(edits: &ContainerEdits) -> PathBuf {
        let args = &edits.hooks[0].args;
        let at = args.iter().position(|a| a == FLAG).expect("a file named");
        PathBuf::from(&args[at + 1])
    }

    /// A container's edits name a file in the state directory (root's alone) from which the
    /// hook gets back the arguments; another container with the same request uses the same
    /// file, marked used and not written again.
    #[test]
    fn edits_name_a_shared_file_that_gives_the_hook_its_arguments() {
        let state = tempfile::tempdir().unwrap();
        let config = config(state.path());
        let mut first = edits(&ARGS);
        externalize(&mut first, &config);
        let path = file_named(&first);
        assert_eq!(path.parent(), Some(state.path().join(DIR_NAME).as_path()));
        assert_eq!(
            inline(&first.hooks[0].args).unwrap()[..],
            edits(&ARGS).hooks[0].args[..]
        );
        let dir_mode = std::fs::metadata(path.parent().unwrap()).unwrap().mode();
        assert_eq!(dir_mode & 0o777, 0o700);

        let an_hour_ago = SystemTime::now() - UNUSED_FOR;
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(an_hour_ago)
            .unwrap();
        let inode = std::fs::metadata(&path).unwrap().ino();
        let mut second = edits(&ARGS);
        externalize(&mut second, &config);
        assert_eq!(second, first);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.ino(), inode, "not written again");
        assert!(meta.modified().unwrap() > an_hour_ago, "marked used");
    }

    /// Writing a file removes those no start used for an hour, and keeps the others.
    #[test]
    fn a_new_file_takes_away_those_unused_for_an_hour() {
        let state = tempfile::tempdir().unwrap();
        let config = config(state.path());
        let (mut old, mut recent, mut new) = (edits(&ARGS), edits(&ARGS[..2]), edits(&ARGS[..3]));
        externalize(&mut old, &config);
        externalize(&mut recent, &config);
        let long_ago = SystemTime::now() - UNUSED_FOR - Duration::from_secs(60);
        File::options()
            .write(true)
            .open(file_named(&old))
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        externalize(&mut new, &config);
        assert!(!file_named(&old).exists());
        assert!(file_named(&recent).exists());
        assert!(file_named(&new).exists());
        // A start that finds its file gone writes it again.
        let mut again = edits(&ARGS);
        externalize(&mut again, &config);
        assert_eq!(
            inline(&again.hooks[0].args).unwrap()[..],
            edits(&ARGS).hooks[0].args[..]
        );
    }

    /// No state directory, or one others may write: the arguments stay inline.
    #[test]
    fn without_a_directory_the_hook_would_read_the_arguments_stay_inline() {
        let mut kept_nothing = edits(&ARGS);
        let keeps_nothing = Config {
            nvml_cache_file: PathBuf::new(),
            ..Config::default()
        };
        externalize(&mut kept_nothing, &keeps_nothing);
        assert_eq!(kept_nothing, edits(&ARGS));

        let state = tempfile::tempdir().unwrap();
        let dir = state.path().join(DIR_NAME);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut open_to_all = edits(&ARGS);
        externalize(&mut open_to_all, &config(state.path()));
        assert_eq!(open_to_all, edits(&ARGS));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }
}
