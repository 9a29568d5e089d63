//! What three of NVIDIA's CDI hooks leave in the image, done by nvhook's createContainer hook
//! when it runs under their names: `enable-cuda-compat` (an ld.so.conf.d file naming the
//! compat directory, by NVIDIA's rule), the part of `update-ldcache` that follows it (the
//! libraries of the directories such files name come first in the cache, as ldconfig would
//! put them), and `update-application-profile` (the driver's EGL/Vulkan GPU mask). Nothing of
//! the image is run: names, ELF notes and device numbers are read through the rootfs.

use crate::delivery::hook_args::CompatHook;
use crate::glob::glob_matches;
use crate::plan::compat::{COMPAT_CONF, FWD_COMPAT_NOTE, FwdCompatNote, nvidia_hook_uses_compat};
use crate::plan::{CacheEntry, LdSoConf};
use crate::rootfs::{Rootfs, RootfsError, sys};
use crate::shown::Shown;
use std::os::fd::AsFd;

/// Where ldconfig reads its directories from, and the files NVIDIA's `enable-cuda-compat`
/// writes there (`00-compat-<uuid>.conf`; nvhook's is [`COMPAT_CONF`]).
pub(crate) const CONF_DIR: &str = "/etc/ld.so.conf.d";
const COMPAT_PREFIX: &str = "00-compat-";
/// More than such a file or directory ever holds.
const MAX_CONF: u64 = 64 << 10;
const MAX_CONFS: usize = 1024;

/// NVIDIA's `enable-cuda-compat`: the conf file that puts the image's compat directory first,
/// when NVIDIA's rule says its libraries serve this host; None (with the reason logged) when
/// it does not.
pub fn enable_cuda_compat(rootfs: &Rootfs, hook: &CompatHook) -> Option<LdSoConf> {
    let why_not = |why: String| {
        tracing::info!(dir = %hook.dir, "CUDA compat (as enable-cuda-compat): {why}: the host's libraries");
        None
    };
    let Some(found) = rootfs.compat_dir_at(&hook.dir) else {
        return why_not("no such directory in the image".into());
    };
    // NVIDIA's glob, `libcuda.so.*.*`.
    let libcuda: Vec<&str> = found
        .files
        .iter()
        .filter(|f| {
            f.strip_prefix("libcuda.so.")
                .is_some_and(|v| v.contains('.'))
        })
        .map(String::as_str)
        .collect();
    let file = match libcuda[..] {
        [file] => file,
        [] => return why_not("it holds no libcuda.so.*.*".into()),
        _ => return why_not(format!("it holds {} libcuda.so.*.* files", libcuda.len())),
    };
    let note = rootfs
        .elf_note(&format!("{}/{file}", hook.dir), FWD_COMPAT_NOTE)
        .and_then(|json| FwdCompatNote::parse(&json));
    let version = &file["libcuda.so.".len()..];
    if !nvidia_hook_uses_compat(
        version,
        hook.host_driver.as_deref(),
        hook.host_cuda.as_deref(),
        note.as_ref(),
    ) {
        return why_not(format!(
            "compat {} (ELF note {}) does not serve host driver {} / CUDA {}",
            Shown(version),
            if note.is_some() { "read" } else { "absent" },
            hook.host_driver.as_deref().unwrap_or("-"),
            hook.host_cuda.as_deref().unwrap_or("-"),
        ));
    }
    // NVIDIA's hook names the directory with its links resolved in the image.
    let dir = rootfs.container_path(&hook.dir)?;
    tracing::info!(dir, compat = %Shown(version), "CUDA compat (as enable-cuda-compat): the compat libraries first");
    Some(LdSoConf {
        path: COMPAT_CONF.into(),
        dirs: vec![dir],
    })
}

/// The loader-cache entries of the libraries in the directories the image's
/// `/etc/ld.so.conf.d/00-compat-*.conf` files name (an `enable-cuda-compat` hook's, NVIDIA's or
/// nvhook's), where the image's ldconfig reads them: ahead of a folder's same-named entries,
/// which stay behind them, as ldconfig orders the copies of the directories it reads first.
/// Each names the library by its SONAME link where the image has one, as ldconfig does, else
/// by its file.
pub fn compat_entries(rootfs: &Rootfs) -> Vec<CacheEntry> {
    let mut entries = Vec::new();
    for dir in compat_dirs(rootfs) {
        for lib in rootfs.libraries_in(&dir) {
            let by_soname = format!("{dir}/{}", lib.soname);
            let path = if rootfs.resolve(&by_soname).is_some() {
                by_soname
            } else {
                format!("{dir}/{}", lib.file)
            };
            entries.push(CacheEntry {
                soname: lib.soname,
                path,
                class: lib.class,
            });
        }
    }
    entries
}

/// The image's loader config, which names the files of [`CONF_DIR`] ldconfig reads.
pub(crate) const LD_SO_CONF: &str = "/etc/ld.so.conf";
const INCLUDE_CONF_DIR: &str = "include /etc/ld.so.conf.d/*.conf\n";

/// NVIDIA's `update-ldcache` gives an image without `/etc/ld.so.conf` one that includes
/// [`CONF_DIR`]'s files (so that its conf files and an `enable-cuda-compat` hook's count).
pub fn include_conf_dir(rootfs: &Rootfs) -> Result<(), RootfsError> {
    if rootfs.resolve(LD_SO_CONF).is_some() {
        return Ok(());
    }
    match rootfs.replace_file(LD_SO_CONF, INCLUDE_CONF_DIR.as_bytes(), 0o644) {
        Err(e @ RootfsError::Volume { .. }) => {
            tracing::info!(path = LD_SO_CONF, "not written: {e}");
            Ok(())
        }
        written => written,
    }
}

/// Whether the image's ldconfig reads `name` of [`CONF_DIR`]: `/etc/ld.so.conf` includes it
/// (a glob of that directory's files), or there is no such file (NVIDIA's `update-ldcache`
/// then writes one that does).
fn conf_dir_is_read(rootfs: &Rootfs, name: &str) -> bool {
    let text = match rootfs.read_file(LD_SO_CONF, MAX_CONF) {
        Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        Ok(None) => return rootfs.resolve(LD_SO_CONF).is_none(),
        Err(_) => return false,
    };
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("include"))
        .flat_map(str::split_whitespace)
        .any(|pattern| {
            // A relative pattern is relative to /etc, the file's directory.
            let pattern = match pattern.strip_prefix('/') {
                Some(_) => pattern.to_string(),
                None => format!("/etc/{pattern}"),
            };
            pattern
                .rsplit_once('/')
                .is_some_and(|(dir, file)| dir == CONF_DIR && glob_matches(file, name))
        })
}

/// The directories listed in the image's compat conf files that its ldconfig reads, in the
/// order it reads them.
fn compat_dirs(rootfs: &Rootfs) -> Vec<String> {
    let Some(names) = rootfs
        .dir_if_exists(CONF_DIR)
        .ok()
        .and_then(|dir| sys::dir_names(dir.as_fd(), MAX_CONFS).ok())
    else {
        return Vec::new();
    };
    let mut names: Vec<String> = names
        .iter()
        .filter_map(|n| n.to_str().ok())
        .filter(|n| n.starts_with(COMPAT_PREFIX) && n.ends_with(".conf"))
        .filter(|n| conf_dir_is_read(rootfs, n))
        .map(str::to_string)
        .collect();
    names.sort();
    let mut dirs: Vec<String> = Vec::new();
    for name in names {
        let path = format!("{CONF_DIR}/{name}");
        let text = match rootfs.read_file(&path, MAX_CONF) {
            Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(path, "not read: {e}");
                continue;
            }
        };
        for dir in text.lines().map(str::trim) {
            if dir.starts_with('/') && !dirs.iter().any(|d| d == dir) {
                dirs.push(dir.to_string());
            }
        }
    }
    dirs
}

/// The file NVIDIA's `update-application-profile` writes, and its directory.
pub(crate) const PROFILE_DIR: &str = "/etc/nvidia/nvidia-application-profiles-rc.d";
const PROFILE: &str = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf";

/// NVIDIA's `update-application-profile`: the driver's application profile limiting EGL and
/// Vulkan to the GPUs whose nodes (`/dev/nvidia<N>`, minors below 64) the container has.
/// Never fails the start (NVIDIA's 1.20.0 did, on a read-only `/etc/nvidia`): a profile that
/// cannot be written is logged and skipped.
pub fn application_profile(rootfs: &Rootfs) {
    let minors = gpu_minors(rootfs);
    let mask = minors
        .iter()
        .filter(|m| **m < 64)
        .fold(0u64, |mask, minor| mask | 1 << minor);
    if mask == 0 {
        tracing::info!("update-application-profile: no GPU node in the container's /dev");
        return;
    }
    // NVIDIA's modes: new directories 0555, the file 0444.
    let written = rootfs
        .create_dirs(PROFILE_DIR, 0o555)
        .and_then(|()| rootfs.replace_file(PROFILE, profile_text(mask).as_bytes(), 0o444));
    match written {
        Ok(()) => tracing::info!(mask = format!("{mask:#x}"), "application profile written"),
        Err(e) => tracing::warn!("update-application-profile skipped: {e}"),
    }
}

/// NVIDIA's profile text for `mask`, byte for byte.
fn profile_text(mask: u64) -> String {
    format!(
        r#"{{"profiles":[{{"name":"_container_","settings":["EGLVisibleDGPUDevices",{mask:#x}]}}],"rules":[{{"pattern":[],"profile":"_container_"}}]}}"#
    )
}

/// The minors of the character devices `/dev/nvidia<N>` of the container.
fn gpu_minors(rootfs: &Rootfs) -> Vec<u32> {
    let Ok(dev) = rootfs.dir_if_exists("/dev") else {
        return Vec::new();
    };
    let Ok(names) = sys::dir_names(dev.as_fd(), MAX_CONFS * 8) else {
        return Vec::new();
    };
    names
        .iter()
        .filter(|name| {
            name.to_bytes()
                .strip_prefix(b"nvidia")
                .is_some_and(|n| !n.is_empty() && n.iter().all(u8::is_ascii_digit))
        })
        .filter_map(|name| sys::lstat_at(dev.as_fd(), name).ok().flatten())
        .filter(|st| sys::file_type(st) == libc::S_IFCHR)
        .map(|st| libc::minor(st.st_rdev))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_is_nvidias_text() {
        assert_eq!(
            profile_text(0b1010),
            r#"{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0xa]}],"rules":[{"pattern":[],"profile":"_container_"}]}"#
        );
    }

    #[test]
    fn includes_as_ldconfig_reads_them() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("etc")).unwrap();
        let reads = |include: &str, name: &str| {
            std::fs::write(tmp.path().join("etc/ld.so.conf"), include).unwrap();
            conf_dir_is_read(&Rootfs::open(tmp.path()).unwrap(), name)
        };
        assert!(reads(
            "include /etc/ld.so.conf.d/*.conf\n",
            "00-compat-x.conf"
        ));
        assert!(reads(
            "include /etc/ld.so.conf.d/00-*\n",
            "00-compat-x.conf"
        ));
        assert!(!reads("include /etc/ld.so.conf.d/*.conf\n", "x.cfg"));
        assert!(!reads("include /etc/*.conf\n", "x.conf"));
    }

    #[test]
    fn compat_confs_count_only_where_ld_so_conf_includes_them() {
        let tmp = tempfile::tempdir().unwrap();
        let conf = tmp.path().join("etc/ld.so.conf.d");
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::write(conf.join("00-compat-a.conf"), "/opt/a\n").unwrap();
        let rootfs = || Rootfs::open(tmp.path()).unwrap();
        // No /etc/ld.so.conf: NVIDIA's update-ldcache writes one that includes them.
        assert_eq!(compat_dirs(&rootfs()), ["/opt/a"]);
        std::fs::write(
            tmp.path().join("etc/ld.so.conf"),
            "/usr/lib/x86_64-linux-gnu\n",
        )
        .unwrap();
        assert!(compat_dirs(&rootfs()).is_empty());
        std::fs::write(
            tmp.path().join("etc/ld.so.conf"),
            "include ld.so.conf.d/*.conf\n",
        )
        .unwrap();
        assert_eq!(compat_dirs(&rootfs()), ["/opt/a"]);
    }

    #[test]
    fn compat_confs_are_read_in_name_order() {
        let tmp = tempfile::tempdir().unwrap();
        let conf = tmp.path().join("etc/ld.so.conf.d");
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::write(
            conf.join("00-compat-b.conf"),
            "/opt/b\n# a comment\nrelative\n",
        )
        .unwrap();
        std::fs::write(conf.join("00-compat-a.conf"), "/opt/a\n/opt/b\n").unwrap();
        std::fs::write(conf.join("10-other.conf"), "/opt/other\n").unwrap();
        let rootfs = Rootfs::open(tmp.path()).unwrap();
        assert_eq!(compat_dirs(&rootfs), ["/opt/a", "/opt/b"]);
    }
}
