//! Which of the CDI hook's file mounts can go into a container as one directory tree: the
//! files a spec binds under a directory the image lacks and only the driver fills, with the
//! links the hook makes there, in a tmpfs of the container's own on that directory
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
    /// The highest of `dir` and its ancestors the image lacks: the hook makes it in the
    /// layer, and the image has its parent.
    pub lacking: String,
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
/// directory is the highest of those the image lacks that only the driver fills: one named for
/// NVIDIA (`/usr/local/nvidia`, `/lib/firmware/nvidia`) or one the spec binds two or more files
/// into (a library directory). Never a directory a distribution's packages also fill
/// (`/etc/vulkan`, `/usr/share/glvnd`, `/lib/firmware`): read-only, it would refuse a package
/// the container installs there. Never a top-level one either. The tree holds every file
/// mount and link at any depth in it, and qualifies with [`MIN_ENTRIES`] entries and nothing
/// the hook writes there later but files and links: no socket or directory mount in it, on it
/// or above it, no cache folder, no loader file, no link on the directory or above it, no path
/// twice, no `.` or `..` in a path.
pub fn dir_groups(args: &LinkArgs, missing: impl Fn(&str) -> Option<String>) -> Vec<DirGroup> {
    let direct = direct_files(args);
    let mut tops: Vec<String> = Vec::new();
    let mut roots = BTreeMap::new();
    for &dir in direct.keys() {
        // Under a directory found missing already, that one is the highest missing: its
        // parent exists. Else the image is asked, only about a directory that could be in a
        // tree: each question is a lookup in the container's layer.
        let known = tops.iter().find(|top| inside(dir, top)).cloned();
        let could_be = || could_be_in_a_tree(dir, &direct);
        let Some(top) = known.or_else(|| could_be().then(|| missing(dir)).flatten()) else {
            continue;
        };
        if let Some(root) = tree_root(dir, &top, &direct) {
            roots.insert(root, top.clone());
        }
        tops.push(top);
    }
    let outermost = roots
        .iter()
        .filter(|&(dir, _)| !roots.keys().any(|other| other != dir && inside(dir, other)));
    let later_writes = [
        loader::CACHE_PATH,
        nvidia_hooks::LD_SO_CONF,
        nvidia_hooks::CONF_DIR,
        nvidia_hooks::PROFILE_DIR,
        procfs::TARGET,
    ];
    let mut groups = Vec::new();
    for (dir, lacking) in outermost {
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
            lacking: lacking.clone(),
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

/// Which of `args`'s mounts could be in a tree of [`dir_groups`] for some image: file mounts in
/// a directory that is, or is under, one only the driver fills. The others never are.
pub fn could_be_in_trees(args: &LinkArgs) -> Vec<bool> {
    let direct = direct_files(args);
    (args.mounts.iter())
        .map(|m| {
            m.kind == MountKind::File
                && parent(&m.destination).is_some_and(|(dir, _)| could_be_in_a_tree(dir, &direct))
        })
        .collect()
}

/// The number of file mounts directly in each directory.
fn direct_files(args: &LinkArgs) -> BTreeMap<&str, usize> {
    let mut direct: BTreeMap<&str, usize> = BTreeMap::new();
    for mount in args.mounts.iter().filter(|m| m.kind == MountKind::File) {
        if let Some((dir, _)) = parent(&mount.destination) {
            *direct.entry(dir).or_default() += 1;
        }
    }
    direct
}

/// Whether the files directly in `dir` could be in a tree: `dir` or one of its ancestors
/// below the top level is one only the driver fills.
fn could_be_in_a_tree(dir: &str, direct: &BTreeMap<&str, usize>) -> bool {
    below_top_level(dir).any(|at| driver_only(at, direct))
}

/// The tree's directory for the file mounts in `dir`, where `top` is the highest of `dir` and
/// its ancestors the image lacks: the highest directory from `top` down to `dir`, below the
/// top level, that only the driver fills (named for NVIDIA, or holding two or more of the
/// file mounts, `direct` counting them by directory). None when there is none.
fn tree_root(dir: &str, top: &str, direct: &BTreeMap<&str, usize>) -> Option<String> {
    if !inside(dir, top) {
        return None;
    }
    below_top_level(dir)
        .filter(|at| at.len() >= top.len())
        .find(|at| driver_only(at, direct))
        .map(str::to_string)
}

/// Whether only the driver fills the directory `at`: it is named for NVIDIA, or `direct`
/// counts two or more of the spec's file mounts in it.
fn driver_only(at: &str, direct: &BTreeMap<&str, usize>) -> bool {
    let name = at.rsplit('/').next().unwrap_or_default();
    name.contains("nvidia") || direct.get(at).is_some_and(|&files| files >= 2)
}

/// The absolute `dir` and its ancestors below the top level, highest first.
fn below_top_level(dir: &str) -> impl Iterator<Item = &str> {
    let ends = dir.match_indices('/').map(|(i, _)| i).chain([dir.len()]);
    ends.map(|end| &dir[..end])
        .filter(|at| at.rfind('/').is_some_and(|i| i > 0))
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
                lacking: "/usr/local/nvidia".to_string(),
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

    /// Files and links deeper in the directory are in its tree; the firmware's tree is the
    /// driver's own directory in `/lib/firmware`.
    #[test]
    fn files_links_and_their_directories_deeper_in_the_directory_are_in_its_tree() {
        let mut a = args();
        a.symlinks.push(link(
            &format!("{LIB}/gbm/nvidia-drm_gbm.so"),
            "../libnvidia-allocator.so.1",
        ));
        a.mounts
            .push(file(&format!("{LIB}/vdpau/libvdpau_nvidia.so.580.1")));
        a.mounts
            .push(file("/lib/firmware/nvidia/580.1/gsp_ga10x.bin"));
        a.mounts
            .push(file("/lib/firmware/nvidia/580.1/gsp_tu10x.bin"));
        let tree = |dir: &str, lacking: &str, mounts: Vec<usize>, links: Vec<usize>| DirGroup {
            dir: dir.to_string(),
            lacking: lacking.to_string(),
            mounts,
            links,
        };
        assert_eq!(
            dir_groups(&a, image(DEBIAN)),
            vec![
                tree("/lib/firmware/nvidia", "/lib/firmware", vec![4, 5], vec![]),
                tree(
                    "/usr/local/nvidia",
                    "/usr/local/nvidia",
                    vec![0, 2, 3],
                    vec![0, 2, 3]
                ),
            ]
        );
    }

    /// Directories a distribution's packages fill too stay per-file even where the image
    /// lacks them: read-only, they would refuse a package the container installs. One the
    /// spec binds two files into is the driver's.
    #[test]
    fn shared_directories_stay_per_file() {
        let a = LinkArgs {
            mounts: vec![
                file("/etc/vulkan/icd.d/nvidia_icd.json"),
                file("/etc/vulkan/implicit_layer.d/nvidia_layers.json"),
                file("/usr/share/glvnd/egl_vendor.d/10_nvidia.json"),
                file("/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json"),
                file("/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json"),
            ],
            ..LinkArgs::default()
        };
        let dirs: Vec<String> = dir_groups(&a, image(DEBIAN))
            .into_iter()
            .map(|group| group.dir)
            .collect();
        assert_eq!(dirs, ["/usr/share/egl/egl_external_platform.d"]);
    }

    /// The rootfs is asked only about directories that could be in a tree: a lone file in a
    /// directory not named for NVIDIA (`/usr/bin`, `/etc/OpenCL/vendors`) is bound one by one
    /// whatever the image has, and a directory under one found missing already
    /// (`/usr/local/nvidia/lib64`) is known to be missing.
    #[test]
    fn the_image_is_asked_only_about_directories_that_could_be_in_a_tree() {
        let mut a = args();
        a.mounts.push(file("/etc/OpenCL/vendors/nvidia.icd"));
        a.mounts
            .push(file("/usr/share/X11/xorg.conf.d/10-nvidia.conf"));
        a.mounts.push(file("/usr/local/nvidia/bin/nvidia-smi"));
        let asked = std::cell::RefCell::new(Vec::new());
        let debian = image(DEBIAN);
        let groups = dir_groups(&a, |dir| {
            asked.borrow_mut().push(dir.to_string());
            debian(dir)
        });
        assert_eq!(asked.into_inner(), ["/usr/local/nvidia/bin"]);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].dir, "/usr/local/nvidia");
        assert_eq!(groups[0].mounts, [0, 2, 5]);
    }

    /// On an image without `/usr` (scratch), a tree is never a top-level directory: a tmpfs on
    /// `/usr` would take every path under it from the container's layer.
    #[test]
    fn a_tree_is_never_a_top_level_directory() {
        let mut a = args();
        a.mounts.push(file("/usr/bin/nvidia-debugdump"));
        let dirs: Vec<String> = dir_groups(&a, image(&[]))
            .into_iter()
            .map(|group| group.dir)
            .collect();
        assert_eq!(dirs, ["/usr/bin", "/usr/local/nvidia"]);
        let top = LinkArgs {
            mounts: vec![file("/nvidia/a.bin"), file("/nvidia/b.bin")],
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
