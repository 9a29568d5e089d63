//! Containers in a user namespace of their own (Kubernetes `hostUsers: false`, Docker's
//! `userns-remap`, Podman's `--userns=auto`): the container's root is an unprivileged id of
//! the host. What nvhook creates in such a container must be that id's, or the container's
//! root cannot use it, and on filesystems mounted inside the namespace (the runtime's `/dev`
//! tmpfs) the kernel refuses to create a file for an id the namespace does not map at all
//! (EOVERFLOW). Nor can a device node be made there: the namespace's mounts are nodev. The
//! hook then binds the host's node instead, as runtimes do for their own devices.

use super::HookError;
use std::os::unix::fs::MetadataExt;

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

#[cfg(test)]
mod tests {
    use super::*;

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
