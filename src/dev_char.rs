//! `/dev/char/MAJ:MIN` links for the device nodes nvhook hands out.
//!
//! With the systemd cgroup driver, runc gives systemd a container's device rules as
//! `DeviceAllow=/dev/char/MAJ:MIN`, and it leaves out every rule whose link does not exist.
//! udev makes those links for most devices, but the NVIDIA driver's nodes are made by
//! nvidia-modprobe or by hand, outside udev. systemd then knows nothing of the GPU rules, and the
//! next `systemctl daemon-reload` rewrites the container's device filter without them: the
//! running container loses its GPUs. Making the links before the runtime reads the rules closes
//! that hole.
//!
//! A link that cannot be made never fails a start: the container still gets its GPUs, only
//! without that protection, and the caller logs why.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::inventory::HostNode;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};

/// A link to make: `/dev/char/<name>` pointing at `<target>`, relative as udev writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharLink {
    /// `MAJ:MIN`.
    pub name: String,
    /// Relative to `/dev/char`: `../nvidia0`, `../nvidia-caps/nvidia-cap1`.
    pub target: String,
    pub major: u32,
    pub minor: u32,
}

impl CharLink {
    /// The link for the host's node at `host_path`, under `dev` (the host's `/dev`); None for
    /// a node outside it, which has no place in `/dev/char`.
    pub fn for_node(dev: &Path, host_path: &Path, major: u32, minor: u32) -> Option<CharLink> {
        let rest = host_path.strip_prefix(dev).ok()?;
        let normal = rest
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        let rest = rest.to_str().filter(|r| normal && !r.is_empty())?;
        Some(CharLink {
            name: format!("{major}:{minor}"),
            target: format!("../{rest}"),
            major,
            minor,
        })
    }
}

/// The links for every NVIDIA node the host has.
pub fn for_host_nodes(dev: &Path, nodes: &[HostNode]) -> Vec<CharLink> {
    nodes
        .iter()
        .filter_map(|n| CharLink::for_node(dev, &n.host_path, n.major, n.minor))
        .collect()
}

/// What became of one link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkOutcome {
    /// It was there and leads to a node with these numbers.
    Present,
    Created,
    /// A link that led nowhere or to another device was put right.
    Replaced,
}

#[derive(Debug, thiserror::Error)]
pub enum DevCharError {
    #[error("cannot open {path} (it must be a directory, not a link): {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot link {path} to {target}: {source}")]
    Link {
        path: PathBuf,
        target: String,
        source: io::Error,
    },
    #[error("{path} is not a link: left as it is")]
    NotALink { path: PathBuf },
}

/// Makes each link in `<dev>/char`, creating that directory if the host has none. `dev` is the
/// host's `/dev` (under the configured dev root). The outer error is the directory's; the
/// inner results are each link's, in order.
pub fn ensure(
    dev: &Path,
    links: &[CharLink],
) -> Result<Vec<Result<LinkOutcome, DevCharError>>, DevCharError> {
    let dir = open_char_dir(dev)?;
    let dir_path = dev.join("char");
    Ok(links
        .iter()
        .map(|link| ensure_one(&dir, &dir_path, link))
        .collect())
}

/// The links of the host nodes `plan` gives a container, made before the runtime turns its
/// device rules into systemd's DeviceAllow= entries; logged, never failed.
pub fn ensure_for_plan(config: &crate::config::Config, plan: &crate::plan::Plan) {
    let dev = config.dev_path("/dev");
    let links: Vec<CharLink> = plan
        .devices
        .iter()
        .filter_map(|d| CharLink::for_node(&dev, &d.host_path, d.major, d.minor))
        .collect();
    ensure_logged(&dev, &links);
}

/// `ensure`, for callers that must not fail over a link: each one made, and each problem, is
/// logged (a problem as a warning naming what systemd will then lack).
pub fn ensure_logged(dev: &Path, links: &[CharLink]) {
    let results = match ensure(dev, links) {
        Ok(results) => results,
        Err(e) => {
            tracing::warn!("{e}: GPU device rules cannot reach systemd (systemd cgroup driver)");
            return;
        }
    };
    for (link, result) in links.iter().zip(results) {
        match result {
            Ok(LinkOutcome::Present) => {}
            Ok(outcome) => {
                tracing::info!(link = %link.name, target = %link.target, ?outcome, "/dev/char link")
            }
            Err(e) => tracing::warn!("{e}: systemd cannot resolve this device's rule"),
        }
    }
}

fn open_char_dir(dev: &Path) -> Result<OwnedFd, DevCharError> {
    let open_err = |path: PathBuf| {
        move |e: Errno| DevCharError::Open {
            path,
            source: e.into(),
        }
    };
    let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_PATH;
    let dev_fd = openat(nix::fcntl::AT_FDCWD, dev, flags, Mode::empty())
        .map_err(open_err(dev.to_path_buf()))?;
    let char_path = dev.join("char");
    match openat(dev_fd.as_fd(), "char", flags, Mode::empty()) {
        Err(Errno::ENOENT) => {
            match mkdirat(dev_fd.as_fd(), "char", Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(open_err(char_path)(e)),
            }
            openat(dev_fd.as_fd(), "char", flags, Mode::empty()).map_err(open_err(char_path))
        }
        other => other.map_err(open_err(char_path)),
    }
}

fn ensure_one(
    dir: &OwnedFd,
    dir_path: &Path,
    link: &CharLink,
) -> Result<LinkOutcome, DevCharError> {
    let path = dir_path.join(&link.name);
    let link_err = |e: Errno| DevCharError::Link {
        path: path.clone(),
        target: link.target.clone(),
        source: e.into(),
    };
    // Every start after a node's first finds its link: one lookup, and nothing written.
    if leads_to(dir, &link.name, link) {
        return Ok(LinkOutcome::Present);
    }
    match symlinkat(link.target.as_str(), dir.as_fd(), link.name.as_str()) {
        Ok(()) => return Ok(LinkOutcome::Created),
        Err(Errno::EEXIST) => {}
        Err(e) => return Err(link_err(e)),
    }
    // Made meanwhile by another start, or there and wrong.
    if leads_to(dir, &link.name, link) {
        return Ok(LinkOutcome::Present);
    }
    let own = fstatat(
        dir.as_fd(),
        link.name.as_str(),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(link_err)?;
    if SFlag::from_bits_truncate(own.st_mode) & SFlag::S_IFMT != SFlag::S_IFLNK {
        return Err(DevCharError::NotALink { path });
    }
    // Put right by rename, so a runtime reading the directory meanwhile sees the old link or
    // the new one, never none.
    let temp = format!(".{}.nvhook-{}", link.name, std::process::id());
    let _ = unlinkat(dir.as_fd(), temp.as_str(), UnlinkatFlags::NoRemoveDir);
    symlinkat(link.target.as_str(), dir.as_fd(), temp.as_str()).map_err(link_err)?;
    renameat(dir.as_fd(), temp.as_str(), dir.as_fd(), link.name.as_str()).map_err(|e| {
        let _ = unlinkat(dir.as_fd(), temp.as_str(), UnlinkatFlags::NoRemoveDir);
        link_err(e)
    })?;
    Ok(LinkOutcome::Replaced)
}

/// Whether the entry resolves to a character device with the link's numbers. A wrong target
/// text that still reaches the right node (`/dev/nvidia0` written absolute) is left alone.
fn leads_to(dir: &OwnedFd, name: &str, link: &CharLink) -> bool {
    let Ok(st) = fstatat(dir.as_fd(), name, AtFlags::empty()) else {
        return false;
    };
    let is_char = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFCHR;
    is_char && libc::major(st.st_rdev) == link.major && libc::minor(st.st_rdev) == link.minor
}

/// Whether `link`'s place holds something other than a link (a file, a directory, a node
/// with other numbers), which [`ensure`] never replaces.
pub fn not_a_link(dev: &Path, link: &CharLink) -> bool {
    std::fs::symlink_metadata(dev.join("char").join(&link.name))
        .is_ok_and(|m| !m.file_type().is_symlink())
}

/// Whether `<dev>/char/MAJ:MIN` resolves to a character device with those numbers: what
/// systemd needs to turn a rule into a `DeviceAllow=` entry.
pub fn resolves(dev: &Path, major: u32, minor: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dev.join("char").join(format!("{major}:{minor}"))).is_ok_and(|m| {
        m.file_type().is_char_device()
            && libc::major(m.rdev()) == major
            && libc::minor(m.rdev()) == minor
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_relative_like_udevs() {
        let dev = Path::new("/sim/dev");
        let l = CharLink::for_node(dev, Path::new("/sim/dev/nvidia0"), 195, 0).unwrap();
        assert_eq!(
            (l.name.as_str(), l.target.as_str()),
            ("195:0", "../nvidia0")
        );
        let cap = Path::new("/sim/dev/nvidia-caps/nvidia-cap1");
        let l = CharLink::for_node(dev, cap, 511, 1).unwrap();
        assert_eq!(l.target, "../nvidia-caps/nvidia-cap1");
    }

    #[test]
    fn nodes_outside_dev_get_no_link() {
        let dev = Path::new("/dev");
        for p in [
            "/nvidia0",
            "/dev",
            "/dev/../etc/passwd",
            "/devx/nvidia0",
            "dev/nvidia0",
        ] {
            assert_eq!(CharLink::for_node(dev, Path::new(p), 1, 2), None, "{p}");
        }
    }

    /// A dev dir whose `null` leads to the host's /dev/null (1:3): no root needed.
    fn dev_with_null() -> (tempfile::TempDir, PathBuf, CharLink) {
        let tmp = tempfile::tempdir().unwrap();
        let dev = tmp.path().join("dev");
        std::fs::create_dir(&dev).unwrap();
        std::os::unix::fs::symlink("/dev/null", dev.join("null")).unwrap();
        let link = CharLink::for_node(&dev, &dev.join("null"), 1, 3).unwrap();
        (tmp, dev, link)
    }

    fn outcome(dev: &Path, link: &CharLink) -> Result<LinkOutcome, DevCharError> {
        ensure(dev, std::slice::from_ref(link)).unwrap().remove(0)
    }

    #[test]
    fn makes_the_directory_and_the_link_once() {
        let (_tmp, dev, link) = dev_with_null();
        assert_eq!(outcome(&dev, &link).unwrap(), LinkOutcome::Created);
        assert_eq!(
            std::fs::read_link(dev.join("char/1:3")).unwrap(),
            Path::new("../null")
        );
        assert!(resolves(&dev, 1, 3));
        assert_eq!(outcome(&dev, &link).unwrap(), LinkOutcome::Present);
    }

    #[test]
    fn puts_right_a_dangling_or_wrong_link() {
        let (_tmp, dev, link) = dev_with_null();
        std::fs::create_dir(dev.join("char")).unwrap();
        for wrong in ["../gone", "/dev/zero"] {
            let entry = dev.join("char/1:3");
            let _ = std::fs::remove_file(&entry);
            std::os::unix::fs::symlink(wrong, &entry).unwrap();
            assert_eq!(
                outcome(&dev, &link).unwrap(),
                LinkOutcome::Replaced,
                "{wrong}"
            );
            assert_eq!(std::fs::read_link(&entry).unwrap(), Path::new("../null"));
        }
        let left: Vec<_> = std::fs::read_dir(dev.join("char")).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary link is left behind");
    }

    #[test]
    fn leaves_what_is_not_a_link() {
        let (_tmp, dev, link) = dev_with_null();
        std::fs::create_dir(dev.join("char")).unwrap();
        std::fs::write(dev.join("char/1:3"), "keep").unwrap();
        assert!(matches!(
            outcome(&dev, &link),
            Err(DevCharError::NotALink { .. })
        ));
        assert_eq!(
            std::fs::read_to_string(dev.join("char/1:3")).unwrap(),
            "keep"
        );
    }

    #[test]
    fn never_writes_through_a_linked_char_directory() {
        let (tmp, dev, link) = dev_with_null();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dev.join("char")).unwrap();
        assert!(matches!(
            ensure(&dev, &[link]),
            Err(DevCharError::Open { .. })
        ));
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }
}
