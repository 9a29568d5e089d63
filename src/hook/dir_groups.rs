//! Which of the CDI hook's file mounts can go into a container as one directory tree: the
//! files a spec binds under the highest directory the image lacks, with the links the hook
//! makes there, in a tmpfs of the container's own on that directory
//! ([`super::effects::tmpfs_tree_in`]), made read-only. That gives the container the view
//! per-file mounts give it, with one directory made in its layer where there would be one for
//! each directory, mount point and link under it. Which directories the image lacks comes from
//! the rootfs, asked through a closure; the rules here need none.

use super::{nvidia_hooks, procfs};
use crate::delivery::hook_args::LinkArgs;
use crate::plan::MountKind;
use crate::rootfs::loader;
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

/// The fewest entries (files, links and the directories holding them) a tree holds: below
/// that, a tmpfs mount costs about what the creates in the layer it saves cost.
const MIN_ENTRIES: usize = 2;

/// The trees of `args` where `missing(dir)` names the highest of `dir` and its ancestors the
/// image lacks (None where the image has `dir`, or where that cannot be told). A tree's
/// directory is that one, for the directory of one file mount or more, but never a top-level
/// one (a tmpfs on a scratch image's `/usr` would take every path under it from the layer):
/// there it is the directory one level down. The tree holds every file mount and link at any
/// depth in it, and qualifies with [`MIN_ENTRIES`] entries and nothing the hook writes there
/// later but files and links: no socket or directory mount in it, on it or above it, no cache
/// folder, no loader file, no link on the directory or above it, no path twice, no `.` or `..`
/// in a path.
pub fn dir_groups(args: &LinkArgs, missing: impl Fn(&str) -> Option<String>) -> Vec<DirGroup> {
    let mut asked: BTreeMap<&str, Option<String>> = BTreeMap::new();
    let mut tops: Vec<String> = Vec::new();
    let mut roots = BTreeSet::new();
    for mount in args.mounts.iter().filter(|m| m.kind == MountKind::File) {
        let Some((dir, _)) = parent(&mount.destination) else {
            continue;
        };
        // Under a directory found missing already, that one is the highest missing: its
        // parent exists.
        let lacking = asked.entry(dir).or_insert_with(|| {
            let known = tops.iter().find(|top| inside(dir, top)).cloned();
            let top = known.or_else(|| missing(dir));
            tops.extend(top.clone());
            top
        });
        if let Some(root) = lacking.as_deref().and_then(|top| tree_root(dir, top)) {
            roots.insert(root);
        }
    }
    let outermost = roots
        .iter()
        .filter(|&dir| !roots.iter().any(|other| other != dir && inside(dir, other)));
    let later_writes = [
        loader::CACHE_PATH,
        nvidia_hooks::LD_SO_CONF,
        nvidia_hooks::CONF_DIR,
        nvidia_hooks::PROFILE_DIR,
        procfs::TARGET,
    ];
    let mut groups = Vec::new();
    for dir in outermost {
        let dir = dir.as_str();
        let in_dir = |path: &str| path != dir && inside(path, dir);
        let crosses = |path: &str| inside(path, dir) || inside(dir, path);
        // A directory or socket mount in the tree, or a directory mount above it, which the
        // hook would attach after the tree and so hide it; a file it writes after the tree
        // is read-only.
        let blocked = args
            .mounts
            .iter()
            .any(|m| m.kind != MountKind::File && crosses(&m.destination))
            || args.symlinks.iter().any(|l| inside(dir, &l.path))
            || (args.folders.iter()).any(|f| crosses(f.dir.trim_end_matches('/')))
            || (args.ld_so_confs.iter()).any(|conf| crosses(&conf.path))
            || later_writes.iter().any(|&path| crosses(path));
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
        let mut subdirs = BTreeSet::new();
        let plain_and_unique = group
            .mounts
            .iter()
            .map(|&i| args.mounts[i].destination.as_str())
            .chain(group.links.iter().map(|&i| args.symlinks[i].path.as_str()))
            .all(|p| {
                let relative = group.relative(p);
                let plain = relative
                    .split('/')
                    .all(|part| !part.is_empty() && part != "." && part != "..");
                let mut holder = relative;
                while let Some((up, _)) = holder.rsplit_once('/') {
                    subdirs.insert(up);
                    holder = up;
                }
                plain && paths.insert(p)
            });
        if plain_and_unique && paths.len() + subdirs.len() >= MIN_ENTRIES {
            groups.push(group);
        }
    }
    groups
}

/// The tree's directory for a file mount in `dir`, where `top` is the highest of `dir` and
/// its ancestors the image lacks: `top`, or below a top-level `top`, the directory of `dir`
/// one level down. None when `top` is not `dir` or above it, or `dir` is top-level itself.
fn tree_root(dir: &str, top: &str) -> Option<String> {
    if !inside(dir, top) {
        return None;
    }
    if top.rfind('/').is_some_and(|i| i > 0) {
        return Some(top.to_string());
    }
    let mut parts = dir.splitn(4, '/');
    let (_, first, second) = (parts.next()?, parts.next()?, parts.next()?);
    (!first.is_empty() && !second.is_empty()).then(|| format!("/{first}/{second}"))
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
    use crate::plan::{LdSoConf, Mount, Symlink};

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

    /// What the rootfs answers for an image holding the directories `has`.
    fn image(has: &'static [&'static str]) -> impl Fn(&str) -> Option<String> {
        move |dir: &str| {
            let mut prefix = String::new();
            for part in dir.split('/').filter(|p| !p.is_empty()) {
                prefix.push('/');
                prefix.push_str(part);
                if !has.contains(&prefix.as_str()) {
                    return Some(prefix);
                }
            }
            None
        }
    }

    /// A Debian-like image: no `/usr/local/nvidia`, no firmware, no Vulkan.
    const DEBIAN: &[&str] = &[
        "/usr",
        "/usr/bin",
        "/usr/local",
        "/usr/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/share",
        "/lib",
        "/etc",
    ];

    #[test]
    fn the_highest_directory_the_image_lacks_is_one_tree_with_its_files_and_links() {
        let groups = dir_groups(&args(), image(DEBIAN));
        assert_eq!(
            groups,
            vec![DirGroup {
                dir: "/usr/local/nvidia".to_string(),
                mounts: vec![0, 2],
                links: vec![0, 2],
            }]
        );
        assert_eq!(
            groups[0].relative(&args().symlinks[0].path),
            "lib64/libcuda.so.1"
        );
        // Where the image has the library directory, its files are bound one by one.
        assert_eq!(
            dir_groups(
                &args(),
                image(&["/usr", "/usr/local", "/usr/local/nvidia", LIB])
            ),
            Vec::new()
        );
    }

    /// Files and links deeper in the directory are in its tree; a file alone in a directory
    /// of its own counts its directories.
    #[test]
    fn files_links_and_their_directories_deeper_in_the_directory_are_in_its_tree() {
        let mut a = args();
        a.symlinks.push(link(
            &format!("{LIB}/gbm/nvidia-drm_gbm.so"),
            "../libnvidia-allocator.so.1",
        ));
        a.mounts
            .push(file(&format!("{LIB}/vdpau/libvdpau_nvidia.so.580.1")));
        a.mounts.push(file("/etc/vulkan/icd.d/nvidia_icd.json"));
        a.mounts
            .push(file("/lib/firmware/nvidia/580.1/gsp_ga10x.bin"));
        a.mounts
            .push(file("/lib/firmware/nvidia/580.1/gsp_tu10x.bin"));
        let tree = |dir: &str, mounts: Vec<usize>, links: Vec<usize>| DirGroup {
            dir: dir.to_string(),
            mounts,
            links,
        };
        assert_eq!(
            dir_groups(&a, image(DEBIAN)),
            vec![
                tree("/etc/vulkan", vec![4], vec![]),
                tree("/lib/firmware", vec![5, 6], vec![]),
                tree("/usr/local/nvidia", vec![0, 2, 3], vec![0, 2, 3]),
            ]
        );
        // `/etc/vulkan` made in the layer holds one file and one directory; an `icd.d` the
        // image lacks in an `/etc/vulkan` it has would hold the file alone.
        let with_vulkan = image(&["/usr", "/usr/local", "/lib", "/etc", "/etc/vulkan"]);
        assert!(
            !dir_groups(&a, with_vulkan)
                .iter()
                .any(|group| group.dir.starts_with("/etc"))
        );
    }

    /// On an image without `/usr` (scratch), a tree's directory is one level below the top:
    /// a tmpfs on `/usr` would take every path under it from the container's layer.
    #[test]
    fn a_tree_is_never_a_top_level_directory() {
        let mut a = args();
        a.mounts.push(file("/usr/bin/nvidia-debugdump"));
        let dirs: Vec<String> = dir_groups(&a, image(&[]))
            .into_iter()
            .map(|group| group.dir)
            .collect();
        assert_eq!(dirs, ["/usr/bin", "/usr/local"]);
        // A file in a top-level directory has no tree.
        let top = LinkArgs {
            mounts: vec![file("/firmware/a.bin"), file("/firmware/b.bin")],
            ..LinkArgs::default()
        };
        assert_eq!(dir_groups(&top, image(&[])), Vec::new());
    }

    /// Anything the hook would write into the directory after making it read-only keeps it
    /// per-file: a socket or directory mount in it, a directory mount above it (attached
    /// after the tree, it would hide it), a folder whose libraries are linked there, a loader
    /// file, a path given twice, a link on the directory or above it.
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
                "a loader conf file",
                with(&|a| {
                    a.ld_so_confs.push(LdSoConf {
                        path: "/usr/local/nvidia/ld.so.conf".into(),
                        dirs: vec![LIB.into()],
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
                with(&|a| a.symlinks.push(link("/usr/local/nvidia", "/elsewhere"))),
            ),
            (
                "a directory mount above it",
                with(&|a| {
                    let mut m = file("/usr/local");
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
            assert_eq!(dir_groups(&a, image(DEBIAN)), Vec::new(), "{what}");
        }
        // The loader's own files: on an image without `/etc/ld.so.conf.d`, a spec's files
        // there stay per-file, since the hook writes its conf file beside them.
        let confs = LinkArgs {
            mounts: vec![
                file("/etc/ld.so.conf.d/a.conf"),
                file("/etc/ld.so.conf.d/b.conf"),
            ],
            ..LinkArgs::default()
        };
        assert_eq!(dir_groups(&confs, image(DEBIAN)), Vec::new());
        // One file alone gains nothing from a directory of its own.
        let mut one = args();
        one.mounts.remove(2);
        one.symlinks.clear();
        let nvidia = image(&["/usr", "/usr/bin", "/usr/local", "/usr/local/nvidia"]);
        assert_eq!(dir_groups(&one, nvidia), Vec::new());
    }
}
