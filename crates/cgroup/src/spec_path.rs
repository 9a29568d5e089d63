//! The cgroup a runtime makes from a spec's `linux.cgroupsPath`, for a process that cannot
//! read its own from `/proc/self/cgroup`: one in the container's cgroup namespace (a
//! createContainer hook), which sees its cgroup as `/`.

use std::path::PathBuf;

/// The directory, relative to the cgroup2 root, that runc and crun make for `cgroups_path`:
/// systemd's `slice:prefix:name` (a `prefix-name.scope` unit in the slice, the slice's
/// dashes its ancestors: `a-b.slice` lies in `a.slice`), or cgroupfs' absolute path. None for
/// a relative path, which runtimes take from their own cgroup.
pub fn relative_dir(cgroups_path: &str) -> Option<PathBuf> {
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    match parts.as_slice() {
        [slice, prefix, name] => {
            let unit = match (name.ends_with(".slice"), prefix.is_empty()) {
                (true, _) => name.to_string(),
                (false, true) => format!("{name}.scope"),
                (false, false) => format!("{prefix}-{name}.scope"),
            };
            let slice = if slice.is_empty() {
                "system.slice"
            } else {
                slice
            };
            let mut dir = expand_slice(slice)?;
            dir.push(unit);
            Some(dir)
        }
        [path] if path.starts_with('/') => {
            let path = PathBuf::from(path.trim_start_matches('/'));
            let plain = path
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            plain.then_some(path)
        }
        _ => None,
    }
}

/// systemd's slice hierarchy: `a-b-c.slice` → `a.slice/a-b.slice/a-b-c.slice`; `-.slice` is
/// the root.
fn expand_slice(slice: &str) -> Option<PathBuf> {
    let stem = slice.strip_suffix(".slice")?;
    if stem == "-" {
        return Some(PathBuf::new());
    }
    if stem.is_empty() || stem.contains('/') || stem.starts_with('-') || stem.ends_with('-') {
        return None;
    }
    let mut dir = PathBuf::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if part.is_empty() {
            return None;
        }
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        dir.push(format!("{prefix}.slice"));
    }
    Some(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_and_cgroupfs_paths_as_runc_makes_them() {
        let cases = [
            (
                "kubepods-burstable-pod1.slice:cri-containerd:abc",
                Some(
                    "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope",
                ),
            ),
            (
                "machine.slice:libpod:abc",
                Some("machine.slice/libpod-abc.scope"),
            ),
            (":docker:abc", Some("system.slice/docker-abc.scope")),
            ("-.slice::abc", Some("abc.scope")),
            ("user.slice:x:my.slice", Some("user.slice/my.slice")),
            (
                "/kubepods/burstable/pod1/abc",
                Some("kubepods/burstable/pod1/abc"),
            ),
            ("/nvhook-e2e-1", Some("nvhook-e2e-1")),
            ("relative/path", None),
            ("/a/../b", None),
            ("a--b.slice:x:y", None),
            ("one:two", None),
        ];
        for (path, expected) in cases {
            assert_eq!(relative_dir(path), expected.map(PathBuf::from), "{path}");
        }
    }
}
