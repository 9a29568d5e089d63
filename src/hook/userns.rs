//! Containers in a user namespace of their own (Kubernetes `hostUsers: false`, Docker's
//! `userns-remap`, Podman's `--userns=auto`): the container's root is an unprivileged id of
//! the host. What nvhook creates in such a container must be that id's, or the container's
//! root cannot use it, and on filesystems mounted inside the namespace (the runtime's `/dev`
//! tmpfs) the kernel refuses to create a file for an id the namespace does not map at all
//! (EOVERFLOW). Nor can a device node be made there: the namespace's mounts are nodev. The
//! hook then binds the host's node instead, as runtimes do for their own devices.

use super::HookError;
use crate::oci::State;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The host ids of the container's root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerRoot {
    pub uid: u32,
    pub gid: u32,
}

/// The host id that id 0 inside is, from a `uid_map` or `gid_map` (lines of `inside outside
/// count`); None when no line maps 0.
pub fn host_id_of_root(map: &str) -> Option<u32> {
    map.lines().find_map(|line| {
        let mut fields = line.split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(inside)), Some(Ok(outside)), Some(Ok(count))) =
            (fields.next(), fields.next(), fields.next())
        else {
            return None;
        };
        // The line whose range holds inside id 0.
        (inside == 0 && count > 0)
            .then(|| u32::try_from(outside).ok())
            .flatten()
    })
}

/// The host ids of the root of the container of `pid` when it is in another user namespace
/// than the hook's; None when it shares the hook's (then nvhook works as root, as always).
pub fn container_root(pid: i32) -> Result<Option<ContainerRoot>, HookError> {
    let fail = |source| HookError::UserNamespace { pid, source };
    let ns = |who: &str| std::fs::metadata(format!("/proc/{who}/ns/user")).map(|m| m.ino());
    if ns(&pid.to_string()).map_err(fail)? == ns("self").map_err(fail)? {
        return Ok(None);
    }
    let map = |name: &str| std::fs::read_to_string(format!("/proc/{pid}/{name}")).map_err(fail);
    let uid = host_id_of_root(&map("uid_map")?);
    let gid = host_id_of_root(&map("gid_map")?);
    match (uid, gid) {
        (Some(uid), Some(gid)) => Ok(Some(ContainerRoot { uid, gid })),
        _ => Err(HookError::UnmappedRoot { pid }),
    }
}

/// Whether this process is in a user namespace other than the host's: its uid map is not the
/// host's one line that maps every id to itself.
pub fn in_user_namespace() -> bool {
    std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|map| !maps_every_id_to_itself(&map))
}

fn maps_every_id_to_itself(map: &str) -> bool {
    let lines: Vec<Vec<&str>> = map
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    lines == [["0", "0", "4294967295"]]
}

/// The rootfs of a container whose hook cannot read the bundle's config.json: at
/// createContainer, run as the container's root in its user namespace (Podman's bundle is in
/// a directory only the host's root may enter); at createRuntime, where crun names its working
/// directory, not the bundle. crun puts the spec's `root.path` in the state; runc runs a
/// createContainer hook from the container's first process (the state's pid, the hook's
/// parent) with the rootfs as its working directory `cwd`. None when neither says where the
/// rootfs is.
pub fn rootfs_from_runtime(state: &State, cwd: Option<&Path>, parent: i32) -> Option<PathBuf> {
    match &state.root {
        Some(root) => Some(state.bundle.join(root)),
        None if state.pid == Some(parent) => cwd.map(Path::to_path_buf),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_hosts_identity_map_is_the_hosts_namespace() {
        assert!(maps_every_id_to_itself(
            "         0          0 4294967295\n"
        ));
        assert!(!maps_every_id_to_itself(
            "         0     100000      65536\n"
        ));
        assert!(!maps_every_id_to_itself("0 0 4294967295\n1 1 1\n"));
        assert!(!maps_every_id_to_itself(""));
    }

    #[test]
    fn the_rootfs_comes_from_crun_s_state_or_runc_s_working_directory() {
        let state = |pid: Option<i32>, root: Option<&str>| State {
            id: "c".into(),
            pid,
            bundle: PathBuf::from("/run/bundle"),
            root: root.map(PathBuf::from),
        };
        let cwd = Some(Path::new("/var/lib/merged"));
        // crun: pid 0 in createContainer's state, and the spec's root, absolute or not.
        assert_eq!(
            rootfs_from_runtime(&state(Some(0), Some("/var/lib/merged")), None, 7),
            Some(PathBuf::from("/var/lib/merged"))
        );
        assert_eq!(
            rootfs_from_runtime(&state(Some(0), Some("rootfs")), None, 7),
            Some(PathBuf::from("/run/bundle/rootfs"))
        );
        // runc: the hook's parent is the state's pid, and its cwd the rootfs.
        assert_eq!(
            rootfs_from_runtime(&state(Some(7), None), cwd, 7),
            cwd.map(Path::to_path_buf)
        );
        // Run by another process, the working directory is nobody's rootfs.
        assert_eq!(rootfs_from_runtime(&state(Some(8), None), cwd, 7), None);
        assert_eq!(rootfs_from_runtime(&state(None, None), cwd, 7), None);
        assert_eq!(rootfs_from_runtime(&state(Some(7), None), None, 7), None);
    }

    #[test]
    fn root_is_found_in_the_line_that_maps_id_0() {
        assert_eq!(
            host_id_of_root("         0     100000      65536\n"),
            Some(100000)
        );
        // Podman --userns=auto style, several ranges, root's not first.
        let map = "1 200001 65535\n0 200000 1\n";
        assert_eq!(host_id_of_root(map), Some(200000));
        // The host's own namespace.
        assert_eq!(host_id_of_root("0 0 4294967295\n"), Some(0));
        assert_eq!(host_id_of_root("1000 100000 1\n"), None);
        assert_eq!(host_id_of_root(""), None);
        assert_eq!(host_id_of_root("0 x 1\n"), None);
        assert_eq!(host_id_of_root("0 5000000000 1\n"), None);
    }
}
