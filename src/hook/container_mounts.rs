//! The runtime's mounts in a container known only by its process and rootfs
//! (nvidia-container-cli's `configure`: no bundle, so no config.json), read from the
//! container's mount table instead of its spec.
//!
//! The spec says which mounts are binds; a mount table does not. A mount counts as the
//! container's own only when it is certainly a filesystem the runtime made for it: a kind the
//! runtime makes per container, showing its whole filesystem, and of a filesystem that no
//! mount of the host's namespace shows. Everything else under the rootfs is treated as a
//! volume, so a mount misjudged costs a refused write, never a write on the host's files.

use crate::oci::MountPoint;
use nvhook_cgroup::mountinfo::{Mount, parse_mount};
use std::collections::HashSet;
use std::path::Path;

/// The filesystems a runtime makes for one container (its /dev, /dev/pts, /dev/shm, ...).
const PER_CONTAINER_KINDS: [&str; 7] = [
    "tmpfs", "devpts", "mqueue", "proc", "sysfs", "cgroup", "cgroup2",
];

/// What the container's mount table says of the mounts below `rootfs`.
#[derive(Debug, PartialEq, Eq)]
pub struct ContainerMounts {
    /// The mounts below the rootfs, with their paths inside it.
    pub mounts: Vec<MountPoint>,
    /// The rootfs's own mount propagates to the host (`shared`).
    pub rootfs_shared: bool,
    /// The rootfs is a mount point of the container's table, as every runtime makes it
    /// (runc binds it onto itself before pivot_root); a plain directory of the host is not.
    pub rootfs_is_mount: bool,
}

/// Reads the mount table of `container` (its mountinfo) against the `host`'s.
pub fn classify(container: &str, host: &str, rootfs: &Path) -> ContainerMounts {
    let host_devices: HashSet<String> = host
        .lines()
        .filter_map(parse_mount)
        .map(|m| m.device)
        .collect();
    let mut rootfs_shared = false;
    let mut rootfs_is_mount = false;
    let mut mounts = Vec::new();
    for mount in container.lines().filter_map(parse_mount) {
        let Ok(inside) = mount.mount_point.strip_prefix(rootfs) else {
            continue;
        };
        if inside.as_os_str().is_empty() {
            // The last mount on the rootfs is the one the container sees.
            rootfs_shared = mount.is_shared();
            rootfs_is_mount = true;
            continue;
        }
        let Some(inside) = inside.to_str() else {
            continue;
        };
        mounts.push(MountPoint {
            destination: format!("/{inside}"),
            bind: !made_for_the_container(&mount, &host_devices),
        });
    }
    ContainerMounts {
        mounts,
        rootfs_shared,
        rootfs_is_mount,
    }
}

fn made_for_the_container(mount: &Mount, host_devices: &HashSet<String>) -> bool {
    PER_CONTAINER_KINDS.contains(&mount.fstype.as_str())
        && mount.root == "/"
        && !host_devices.contains(&mount.device)
}

/// Whether the process `pid` shares nvhook's own mount namespace: a process of the host, not a
/// container's (whose runtime made it a namespace of its own).
pub fn shares_our_mount_ns(pid: i32) -> Result<bool, std::io::Error> {
    use std::os::unix::fs::MetadataExt;
    let theirs = std::fs::metadata(format!("/proc/{pid}/ns/mnt"))?;
    let ours = std::fs::metadata("/proc/self/ns/mnt")?;
    Ok(theirs.dev() == ours.dev() && theirs.ino() == ours.ino())
}

/// Whether pid 1 of this `/proc` sees the very mount this process has as its root. Before
/// pivot_root, /proc is still the runtime's, and its pid 1 is in the runtime's mount
/// namespace: a namespace made for the container copies every mount under new ids. (Its
/// `ns/mnt` link would say the same but needs ptrace access to pid 1, which a hook in the
/// container's PID namespace lacks; mountinfo does not.) Only pid 1's table is read, which
/// grows with every mount of the node: this process's root mount is known by its id.
pub fn init_shares_our_root_mount() -> Result<bool, std::io::Error> {
    let root = std::fs::File::open("/")?;
    let ours = match crate::rootfs::sys::mount_id(std::os::fd::AsFd::as_fd(&root)) {
        Ok(id) if id != 0 => id.to_string(),
        // A kernel before 5.8 gives no id (and an id of 0 is taken as none): this process's
        // own table says.
        _ => match root_mount_id(&std::fs::read_to_string("/proc/self/mountinfo")?) {
            Some(id) => id.to_owned(),
            None => return Ok(false),
        },
    };
    let init = std::fs::read_to_string("/proc/1/mountinfo")?;
    Ok(init
        .lines()
        .any(|l| l.split(' ').next() == Some(ours.as_str())))
}

/// The id of the mount at `/` in mount table `mountinfo`.
fn root_mount_id(mountinfo: &str) -> Option<&str> {
    let line = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))?;
    line.split(' ').next()
}

/// [`classify`] for the process `pid`, from the host's `/proc`.
pub fn read(pid: i32, rootfs: &Path) -> Result<ContainerMounts, std::io::Error> {
    let container = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    let host = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(classify(&container, &host, rootfs))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "\
22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/root rw
30 22 0:25 / /run rw,nosuid shared:5 - tmpfs tmpfs rw
40 30 0:50 / /run/c/b/rootfs rw shared:9 - overlay overlay rw,lowerdir=/l
41 22 0:33 / /var/lib/docker/containers/x/mounts/shm rw shared:12 - tmpfs shm rw
";

    const CONTAINER: &str = "\
100 99 259:1 / / rw,relatime master:1 - ext4 /dev/root rw
101 100 0:50 / /run/c/b/rootfs rw master:9 - overlay overlay rw,lowerdir=/l
102 101 0:50 / /run/c/b/rootfs rw - overlay overlay rw,lowerdir=/l
103 102 0:61 / /run/c/b/rootfs/dev rw,nosuid - tmpfs tmpfs rw,mode=755
104 103 0:62 / /run/c/b/rootfs/dev/pts rw - devpts devpts rw
105 103 0:33 / /run/c/b/rootfs/dev/shm rw - tmpfs shm rw
106 102 259:1 /srv/data /run/c/b/rootfs/data rw - ext4 /dev/root rw
107 102 0:63 / /run/c/b/rootfs/my\\040vol rw - ext4 /dev/sdb rw
108 102 259:1 /etc/hosts /run/c/b/rootfs/etc/hosts rw - ext4 /dev/root rw
109 22 0:64 / /run/c/b/rootfsx rw - tmpfs tmpfs rw
";

    fn point(destination: &str, bind: bool) -> MountPoint {
        MountPoint {
            destination: destination.to_string(),
            bind,
        }
    }

    #[test]
    fn only_fresh_per_container_filesystems_are_the_containers_own() {
        let seen = classify(CONTAINER, HOST, Path::new("/run/c/b/rootfs"));
        assert_eq!(
            seen,
            ContainerMounts {
                mounts: vec![
                    point("/dev", false),
                    point("/dev/pts", false),
                    // A host tmpfs bound in (Docker's /dev/shm) is the host's.
                    point("/dev/shm", true),
                    point("/data", true),
                    // A filesystem of a kind no runtime makes per container.
                    point("/my vol", true),
                    point("/etc/hosts", true),
                ],
                rootfs_shared: false,
                rootfs_is_mount: true,
            }
        );
    }

    /// Whether pid 1 sees this process's root mount, by both tables: this process's own names
    /// the mount at its root (where it has one).
    fn by_both_tables() -> bool {
        let own = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let init = std::fs::read_to_string("/proc/1/mountinfo").unwrap();
        root_mount_id(&own).is_some_and(|id| init.lines().any(|l| l.split(' ').next() == Some(id)))
    }

    /// The root mount's id from statx gives what reading both tables gives: yes in the host's
    /// mount namespace (the tests here), no in one of its own (the arm64 tests, chrooted in an
    /// unshared namespace).
    #[test]
    fn pid_1_sees_our_root_mount_as_both_tables_say() {
        assert_eq!(init_shares_our_root_mount().unwrap(), by_both_tables());
    }

    #[test]
    fn a_host_directory_is_no_rootfs_mount() {
        let seen = classify(HOST, HOST, Path::new("/srv/data"));
        assert!(!seen.rootfs_is_mount);
        assert!(seen.mounts.is_empty());
    }

    #[test]
    fn a_shared_rootfs_is_seen_on_its_last_mount() {
        let shared = CONTAINER.replace(
            "102 101 0:50 / /run/c/b/rootfs rw -",
            "102 101 0:50 / /run/c/b/rootfs rw shared:77 -",
        );
        assert!(classify(&shared, HOST, Path::new("/run/c/b/rootfs")).rootfs_shared);
    }
}
