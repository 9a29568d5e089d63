//! Finding a process's devices cgroup directory from `/proc/<pid>/cgroup` and mountinfo.
//!
//! Pure functions over the two files' text, so that every layout (v1, v2, hybrid, cgroup
//! namespaces, over-mounts) is tested without root.

use crate::mountinfo::{Mount, parse_mount};
use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

/// The directory that holds a process's device policy, by mechanism.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// A cgroup v1 `devices` hierarchy directory (has `devices.allow`).
    V1(PathBuf),
    /// A cgroup2 directory (BPF device programs attach to it).
    V2(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocateError {
    #[error("it lists neither a v1 `devices` hierarchy nor a cgroup2 `0::` entry")]
    NoEntry,
    #[error(
        "its cgroup {path} is under no {fstype} mount visible here (mount the cgroup filesystem, or run in the host mount namespace)"
    )]
    NotMounted { fstype: &'static str, path: String },
    #[error(
        "its cgroup {0} lies outside this process's cgroup namespace (run in the host cgroup namespace)"
    )]
    OutsideNamespace(String),
}

/// One line of `/proc/<pid>/cgroup`: `hierarchy-id:controllers:path`.
#[derive(Debug, PartialEq, Eq)]
struct Membership<'a> {
    hierarchy: &'a str,
    controllers: &'a str,
    path: &'a str,
}

fn parse_membership(text: &str) -> Vec<Membership<'_>> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            Some(Membership {
                hierarchy: fields.next()?,
                controllers: fields.next()?,
                path: fields.next()?,
            })
        })
        .collect()
}

/// The mounts that path lookups can reach: mountinfo lists mounts in the order they were
/// made, and a later mount on a path hides every earlier one at or below it (this is how a
/// cgroup2 mounted over a hybrid /sys/fs/cgroup hides the v1 hierarchies beneath).
///
/// A busy node has a thousand mounts and more (every pod's rootfs, shm and volumes): each mount
/// is looked up by its mount point and the directories above it among the mount points of the
/// mounts after it, not compared with every other mount.
pub(crate) fn visible_mounts(mountinfo: &str) -> Vec<Mount> {
    let mounts: Vec<Mount> = mountinfo.lines().filter_map(parse_mount).collect();
    let mut later: HashSet<&Path> = HashSet::with_capacity(mounts.len());
    let mut visible = vec![false; mounts.len()];
    for (i, mount) in mounts.iter().enumerate().rev() {
        visible[i] = !mount.mount_point.ancestors().any(|dir| later.contains(dir));
        later.insert(&mount.mount_point);
    }
    mounts
        .into_iter()
        .zip(visible)
        .filter_map(|(mount, visible)| visible.then_some(mount))
        .collect()
}

/// The directory of cgroup `path` under a mount of the right kind whose root contains it.
fn resolve(
    mounts: &[Mount],
    path: &str,
    is_hierarchy: impl Fn(&Mount) -> bool,
) -> Result<Option<PathBuf>, LocateError> {
    // The kernel writes `/..` components for cgroups outside the reader's namespace.
    if Path::new(path)
        .components()
        .any(|c| c == Component::ParentDir)
    {
        return Err(LocateError::OutsideNamespace(path.to_owned()));
    }
    let dir = mounts.iter().filter(|m| is_hierarchy(m)).find_map(|m| {
        let below = Path::new(path).strip_prefix(&m.root).ok()?;
        // join("") would add a trailing slash
        Some(if below.as_os_str().is_empty() {
            m.mount_point.clone()
        } else {
            m.mount_point.join(below)
        })
    });
    Ok(dir)
}

/// Where the device policy of the process whose `/proc/<pid>/cgroup` is `membership` lives
/// on most hosts, from its membership alone: its `devices` directory under
/// `/sys/fs/cgroup/devices` when it is in a v1 `devices` hierarchy, else its cgroup2 directory
/// under `/sys/fs/cgroup`. A guess, for the caller to check before trusting it (the directory
/// is of that kind and holds the process); None for a path with `..` in it.
pub(crate) fn usual_location(membership: &str) -> Option<Location> {
    let entries = parse_membership(membership);
    let below = |root: &str, path: &str| {
        let relative = Path::new(path.trim_start_matches('/'));
        let up = relative.components().any(|c| c == Component::ParentDir);
        (!up).then(|| {
            Path::new(root)
                .join(relative)
                .components()
                .collect::<PathBuf>()
        })
    };
    match entries
        .iter()
        .find(|e| e.hierarchy != "0" && e.controllers.split(',').any(|c| c == "devices"))
    {
        Some(v1) => below("/sys/fs/cgroup/devices", v1.path).map(Location::V1),
        None => {
            let v2 = entries
                .iter()
                .find(|e| e.hierarchy == "0" && e.controllers.is_empty())?;
            below("/sys/fs/cgroup", v2.path).map(Location::V2)
        }
    }
}

/// Where the device policy of the process whose `/proc/<pid>/cgroup` is `membership`
/// lives, given the caller's `mountinfo`.
///
/// A mounted v1 `devices` hierarchy wins (on hybrid hosts the v1 controller is what the
/// runtime programmed); otherwise the cgroup2 directory, as runc decides.
pub(crate) fn locate(membership: &str, mountinfo: &str) -> Result<Location, LocateError> {
    let entries = parse_membership(membership);
    let mounts = visible_mounts(mountinfo);
    let v1 = entries
        .iter()
        .find(|e| e.hierarchy != "0" && e.controllers.split(',').any(|c| c == "devices"));
    let v2 = entries
        .iter()
        .find(|e| e.hierarchy == "0" && e.controllers.is_empty());
    if let Some(entry) = v1 {
        let devices = |m: &Mount| m.fstype == "cgroup" && m.has_super_option("devices");
        if let Some(dir) = resolve(&mounts, entry.path, devices)? {
            return Ok(Location::V1(dir));
        }
    }
    let v1_not_mounted = |entry: &Membership| LocateError::NotMounted {
        fstype: "cgroup v1 devices",
        path: entry.path.to_owned(),
    };
    match (v1, v2) {
        (_, Some(entry)) => resolve(&mounts, entry.path, |m| m.fstype == "cgroup2")?
            .map(Location::V2)
            // With neither mounted, the v1 controller the process belongs to is the one named.
            .ok_or_else(|| match v1 {
                Some(v1) => v1_not_mounted(v1),
                None => LocateError::NotMounted {
                    fstype: "cgroup2",
                    path: entry.path.to_owned(),
                },
            }),
        (Some(entry), None) => Err(v1_not_mounted(entry)),
        (None, None) => Err(LocateError::NoEntry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_CGROUP: &str = "\
12:devices:/docker/0123abcd
11:memory:/docker/0123abcd
3:cpu,cpuacct:/docker/0123abcd
1:name=systemd:/docker/0123abcd
0::/docker/0123abcd
";

    const HYBRID_MOUNTINFO: &str = "\
22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/root rw
25 22 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 25 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:8 - tmpfs tmpfs ro,mode=755
27 26 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
28 26 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,name=systemd
31 26 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,cpu,cpuacct
35 26 0:31 / /sys/fs/cgroup/devices rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,devices
36 26 0:32 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:18 - cgroup cgroup rw,memory
";

    /// The mounts each later one does not cover, by comparing every pair: what
    /// [`visible_mounts`] must find.
    fn visible_pairwise(mountinfo: &str) -> Vec<Mount> {
        let mut visible: Vec<Mount> = Vec::new();
        for mount in mountinfo.lines().filter_map(parse_mount) {
            visible.retain(|earlier| !earlier.mount_point.starts_with(&mount.mount_point));
            visible.push(mount);
        }
        visible
    }

    #[test]
    fn visible_mounts_are_those_no_later_mount_covers() {
        // Below the root, mount points drawn over and over from a few nested paths, so that
        // mounts stack on one point, cover whole subtrees, and are made again below a cover.
        let points = [
            "/sys",
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/devices",
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroupx",
            "/run",
            "/run/containerd/io.containerd.runtime.v2.task/k8s.io/a/rootfs",
            "/run/containerd/io.containerd.runtime.v2.task/k8s.io/a/rootfs/dev",
            "/var/lib/kubelet/pods/p/volumes/kubernetes.io~projected/token",
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut mountinfo = String::from("1 0 259:1 / / rw - ext4 /dev/root rw\n");
        for id in 2..600 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let point = points[(seed >> 33) as usize % points.len()];
            mountinfo.push_str(&format!("{id} 1 0:{id} / {point} rw - tmpfs tmpfs rw\n"));
        }
        let pairwise = visible_pairwise(&mountinfo);
        assert!(pairwise.len() < 600 && !pairwise.is_empty());
        assert_eq!(visible_mounts(&mountinfo), pairwise);
        assert_eq!(
            visible_mounts(HYBRID_MOUNTINFO),
            visible_pairwise(HYBRID_MOUNTINFO)
        );
    }

    #[test]
    fn the_usual_location_is_by_membership_alone() {
        assert_eq!(
            usual_location(HYBRID_CGROUP),
            Some(Location::V1(PathBuf::from(
                "/sys/fs/cgroup/devices/docker/0123abcd"
            )))
        );
        assert_eq!(
            usual_location("0::/kubepods.slice/pod1/abc\n"),
            Some(Location::V2(PathBuf::from(
                "/sys/fs/cgroup/kubepods.slice/pod1/abc"
            )))
        );
        // The hierarchy's root is the mount itself, with no trailing slash.
        assert_eq!(
            usual_location("0::/\n"),
            Some(Location::V2(PathBuf::from("/sys/fs/cgroup")))
        );
        // A v1 devices hierarchy is the guess even where a cgroup2 entry is listed too.
        assert!(matches!(
            usual_location("5:devices:/\n0::/x\n"),
            Some(Location::V1(dir)) if dir == Path::new("/sys/fs/cgroup/devices")
        ));
        assert_eq!(usual_location("0::/../../escape\n"), None);
        assert_eq!(usual_location("12:devices:/a/../b\n0::/ok\n"), None);
        assert_eq!(usual_location("1:name=systemd:/x\n"), None);
    }

    #[test]
    fn v1_devices_hierarchy_wins_on_hybrid_hosts() {
        assert_eq!(
            locate(HYBRID_CGROUP, HYBRID_MOUNTINFO),
            Ok(Location::V1(PathBuf::from(
                "/sys/fs/cgroup/devices/docker/0123abcd"
            )))
        );
    }

    #[test]
    fn pure_v2_host() {
        let membership = "0::/system.slice/containerd.service/k8s.io/abc\n";
        let mountinfo = "\
22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/root rw
25 22 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
26 25 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
        assert_eq!(
            locate(membership, mountinfo),
            Ok(Location::V2(PathBuf::from(
                "/sys/fs/cgroup/system.slice/containerd.service/k8s.io/abc"
            )))
        );
    }

    #[test]
    fn cgroup2_mounted_over_hybrid_tree_hides_v1_hierarchies() {
        // What `unshare -m` + `mount -t cgroup2 none /sys/fs/cgroup` leaves: the v1
        // mounts are still listed, but nothing can reach them any more.
        let mountinfo = format!(
            "{HYBRID_MOUNTINFO}512 26 0:23 / /sys/fs/cgroup rw,relatime - cgroup2 none rw\n"
        );
        assert_eq!(
            locate(HYBRID_CGROUP, &mountinfo),
            Ok(Location::V2(PathBuf::from(
                "/sys/fs/cgroup/docker/0123abcd"
            )))
        );
    }

    #[test]
    fn hybrid_host_without_devices_line_uses_unified() {
        let membership = "3:cpu,cpuacct:/x\n0::/x\n";
        let mountinfo = HYBRID_MOUNTINFO.replace(" rw,devices", " rw,pids");
        assert_eq!(
            locate(membership, &mountinfo),
            Ok(Location::V2(PathBuf::from("/sys/fs/cgroup/unified/x")))
        );
    }

    #[test]
    fn mount_root_inside_a_cgroup_namespace_is_stripped() {
        // A cgroupns'd mount shows its root as the namespace's cgroup path.
        let membership = "0::/kubepods/pod1/ctr\n";
        let mountinfo = "\
1 0 8:1 / / rw - ext4 /dev/sda1 rw
40 1 0:30 /kubepods/pod1 /host/cgroup rw - cgroup2 cgroup2 rw
";
        assert_eq!(
            locate(membership, mountinfo),
            Ok(Location::V2(PathBuf::from("/host/cgroup/ctr")))
        );
        let mountinfo = "40 1 0:30 /kubepods/pod10 /host/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            locate(membership, mountinfo),
            Err(LocateError::NotMounted {
                fstype: "cgroup2",
                path: "/kubepods/pod1/ctr".into()
            })
        );
    }

    #[test]
    fn v1_devices_under_a_bind_of_a_subtree() {
        let membership = "5:devices:/docker/abc\n";
        let mountinfo = "\
1 0 8:1 / / rw - ext4 /dev/sda1 rw
50 1 0:31 /docker /cg/devices rw - cgroup cgroup rw,devices
";
        assert_eq!(
            locate(membership, mountinfo),
            Ok(Location::V1(PathBuf::from("/cg/devices/abc")))
        );
    }

    #[test]
    fn cgroup_outside_our_namespace_is_refused() {
        let membership = "0::/../../other\n";
        let mountinfo = "26 25 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            locate(membership, mountinfo),
            Err(LocateError::OutsideNamespace("/../../other".into()))
        );
    }

    #[test]
    fn missing_entries_and_mounts_are_named() {
        assert_eq!(locate("", HYBRID_MOUNTINFO), Err(LocateError::NoEntry));
        assert_eq!(
            locate("5:devices:/a\n", "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"),
            Err(LocateError::NotMounted {
                fstype: "cgroup v1 devices",
                path: "/a".into()
            })
        );
        // A hybrid host where nothing is mounted: the v1 devices membership is named.
        assert_eq!(
            locate(HYBRID_CGROUP, "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"),
            Err(LocateError::NotMounted {
                fstype: "cgroup v1 devices",
                path: "/docker/0123abcd".into()
            })
        );
    }

    #[test]
    fn escaped_mount_points_are_decoded() {
        let mountinfo = "26 25 0:22 / /run/my\\040cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            locate("0::/a\n", mountinfo),
            Ok(Location::V2(PathBuf::from("/run/my cgroup/a")))
        );
    }

    #[test]
    fn optional_fields_do_not_shift_the_parse() {
        let line =
            "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 shared:3 - cgroup2 none rw,nsdelegate";
        let mount = parse_mount(line).unwrap();
        assert_eq!(mount.root, "/mnt1");
        assert_eq!(mount.mount_point, PathBuf::from("/mnt2"));
        assert_eq!(mount.fstype, "cgroup2");
        assert!(mount.has_super_option("nsdelegate"));
    }
}
