//! Which of the CDI hook's file mounts can go into a container as one directory tree: the
//! files a spec binds into one container directory, with the links the hook makes there, in a
//! tmpfs of the container's own on that directory ([`super::effects::tmpfs_tree_in`]), made
//! read-only. That gives the container the view per-file mounts give it only where the image
//! has no such directory, which the hook checks once it sees the rootfs; here are the rules
//! that need no rootfs.

use crate::delivery::hook_args::LinkArgs;
use crate::plan::MountKind;
use std::collections::{BTreeMap, BTreeSet};

/// A container directory whose files and links could be one tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirGroup {
    /// The container directory, absolute, without a trailing `/`.
    pub dir: String,
    /// The indices of its file mounts in [`LinkArgs::mounts`], at any depth in it.
    pub mounts: Vec<usize>,
    /// The indices of its links in [`LinkArgs::symlinks`], at any depth in it.
    pub links: Vec<usize>,
}

impl DirGroup {
    /// `path`'s place in the directory (`gbm/nvidia-drm_gbm.so`).
    pub fn relative<'a>(&self, path: &'a str) -> &'a str {
        path.strip_prefix(self.dir.as_str())
            .map_or(path, |rest| rest.trim_start_matches('/'))
    }
}

/// The directories of `args` that hold two or more file mounts of their own and nothing the
/// hook writes there later but files and links: no socket or directory mount in them, on
/// them or above them, no cache folder, no link on the directory itself, no path twice, no `.` or `..` in a
/// path. A directory inside another such directory is part of it. A directory that cannot be
/// one tree stays per-file mounts.
pub fn dir_groups(args: &LinkArgs) -> Vec<DirGroup> {
    let mut direct: BTreeMap<&str, usize> = BTreeMap::new();
    for mount in args.mounts.iter().filter(|m| m.kind == MountKind::File) {
        if let Some((dir, _)) = parent(&mount.destination) {
            *direct.entry(dir).or_default() += 1;
        }
    }
    let candidates: Vec<&str> = direct
        .iter()
        .filter(|&(_, &files)| files >= 2)
        .map(|(&dir, _)| dir)
        .collect();
    let outermost = candidates.iter().filter(|&&dir| {
        !candidates
            .iter()
            .any(|&other| other != dir && inside(dir, other))
    });
    let mut groups = Vec::new();
    for &dir in outermost {
        let in_dir = |path: &str| path != dir && inside(path, dir);
        // A directory or socket mount in the tree, or a directory mount above it, which the
        // hook would attach after the tree and so hide it.
        let blocked = args.mounts.iter().any(|m| {
            m.kind != MountKind::File
                && (inside(&m.destination, dir) || inside(dir, &m.destination))
        }) || args.symlinks.iter().any(|l| l.path == dir)
            || args
                .folders
                .iter()
                .any(|f| inside(f.dir.trim_end_matches('/'), dir));
        if blocked {
            continue;
        }
        let group = DirGroup {
            dir: dir.to_string(),
            mounts: (args.mounts.iter().enumerate())
                .filter(|(_, m)| in_dir(&m.destination))
                .map(|(i, _)| i)
                .collect(),
            links: (args.symlinks.iter().enumerate())
                .filter(|(_, l)| in_dir(&l.path))
                .map(|(i, _)| i)
                .collect(),
        };
        let mut paths = BTreeSet::new();
        let plain_and_unique = group
            .mounts
            .iter()
            .map(|&i| args.mounts[i].destination.as_str())
            .chain(group.links.iter().map(|&i| args.symlinks[i].path.as_str()))
            .all(|p| {
                let plain = group
                    .relative(p)
                    .split('/')
                    .all(|part| !part.is_empty() && part != "." && part != "..");
                plain && paths.insert(p)
            });
        if plain_and_unique {
            groups.push(group);
        }
    }
    groups
}

/// Whether `path` is `dir` or under it.
fn inside(path: &str, dir: &str) -> bool {
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// An absolute path's directory and last component; None for `/` or a relative path.
fn parent(path: &str) -> Option<(&str, &str)> {
    let (dir, name) = path.rsplit_once('/')?;
    (path.starts_with('/') && !dir.is_empty() && !name.is_empty() && name != "." && name != "..")
        .then_some((dir, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::hook_args::LibFolder;
    use crate::plan::{Mount, Symlink};

    fn file(dest: &str) -> Mount {
        Mount {
            source: format!("/host{dest}").into(),
            destination: dest.to_string(),
            kind: MountKind::File,
        }
    }

    fn link(path: &str, target: &str) -> Symlink {
        Symlink {
            path: path.to_string(),
            target: target.to_string(),
        }
    }

    const LIB: &str = "/usr/local/nvidia/lib64";

    fn args() -> LinkArgs {
        LinkArgs {
            mounts: vec![
                file(&format!("{LIB}/libcuda.so.580.1")),
                file("/usr/bin/nvidia-smi"),
                file(&format!("{LIB}/libnvidia-ml.so.580.1")),
            ],
            symlinks: vec![
                link(&format!("{LIB}/libcuda.so.1"), "libcuda.so.580.1"),
                link("/usr/lib/x86_64-linux-gnu/libcuda.so", "libcuda.so.1"),
                link(&format!("{LIB}/libnvidia-ml.so.1"), "libnvidia-ml.so.580.1"),
            ],
            ..LinkArgs::default()
        }
    }

    #[test]
    fn a_directory_of_two_files_is_one_group_with_its_links() {
        assert_eq!(
            dir_groups(&args()),
            vec![DirGroup {
                dir: LIB.to_string(),
                mounts: vec![0, 2],
                links: vec![0, 2],
            }]
        );
    }

    /// Files and links deeper in the directory are in its tree, and a directory of files
    /// inside it is part of it.
    #[test]
    fn files_and_links_deeper_in_the_directory_are_in_its_tree() {
        let mut a = args();
        a.symlinks.push(link(
            &format!("{LIB}/gbm/nvidia-drm_gbm.so"),
            "../libnvidia-allocator.so.1",
        ));
        a.mounts
            .push(file(&format!("{LIB}/vdpau/libvdpau_nvidia.so.580.1")));
        a.mounts
            .push(file(&format!("{LIB}/vdpau/libvdpau_nvidia.so.1")));
        let groups = dir_groups(&a);
        assert_eq!(
            groups,
            vec![DirGroup {
                dir: LIB.to_string(),
                mounts: vec![0, 2, 3, 4],
                links: vec![0, 2, 3],
            }]
        );
        assert_eq!(
            groups[0].relative(&a.symlinks[3].path),
            "gbm/nvidia-drm_gbm.so"
        );
    }

    /// Anything the hook would write into the directory after making it read-only keeps it
    /// per-file: a socket or directory mount in it, a directory mount above it (attached
    /// after the tree, it would hide it), a folder whose libraries are linked there, a path
    /// given twice, a link on the directory itself.
    #[test]
    fn a_directory_the_hook_writes_into_later_stays_per_file() {
        let with = |change: &dyn Fn(&mut LinkArgs)| {
            let mut a = args();
            change(&mut a);
            a
        };
        let socket_at = |path: String| {
            move |a: &mut LinkArgs| {
                let mut m = file(&path);
                m.kind = MountKind::Socket;
                a.mounts.push(m);
            }
        };
        let cases = [
            ("a socket mount", with(&socket_at(format!("{LIB}/socket")))),
            (
                "a socket mount deeper",
                with(&socket_at(format!("{LIB}/run/socket"))),
            ),
            (
                "a folder",
                with(&|a| {
                    a.folders.push(LibFolder {
                        dir: format!("{LIB}/"),
                        cache: true,
                    })
                }),
            ),
            (
                "a path twice",
                with(&|a| {
                    a.symlinks
                        .push(link(&format!("{LIB}/libcuda.so.580.1"), "libcuda.so.1"))
                }),
            ),
            (
                "a link on the directory",
                with(&|a| a.symlinks.push(link(LIB, "/elsewhere"))),
            ),
            (
                "a directory mount above it",
                with(&|a| {
                    let mut m = file("/usr/local/nvidia");
                    m.kind = MountKind::Dir;
                    a.mounts.push(m);
                }),
            ),
            (
                "a path through ..",
                with(&|a| a.symlinks.push(link(&format!("{LIB}/../escape"), "x"))),
            ),
        ];
        for (what, a) in cases {
            assert_eq!(dir_groups(&a), Vec::new(), "{what}");
        }
        // One file alone gains nothing from a directory of its own.
        let mut one = args();
        one.mounts.remove(2);
        assert_eq!(dir_groups(&one), Vec::new());
    }
}
