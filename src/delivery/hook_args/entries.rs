//! The hook's lists (bind mounts, links, loader-cache entries) as arguments. A directory's
//! entries go in one group, `--bind-files DIR A,B,C` for `--bind-file ROOT/DIR/A DIR/A
//! --bind-file ...`: a runtime carries a hook's arguments through each command it runs on
//! the container (it reads them from config.json, writes them into its state, passes them
//! to the hook), and containerd stores them with the container's spec, so a spec's size is
//! paid at every start. An entry a group cannot say (a name with a comma, a file whose path
//! in the container is not its path under the host root) keeps its one-entry form, which is
//! also what specs written before the groups hold; both are read.

use super::LinkArgs;
use crate::plan::{CacheEntry, Mount, MountKind, Symlink};
use nvhook_ldcache::ElfClass;

/// The kinds of group, by their flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Group {
    Binds(MountKind),
    Links,
    Libs(ElfClass),
}

impl Group {
    const ALL: [Group; 6] = [
        Group::Binds(MountKind::File),
        Group::Binds(MountKind::Dir),
        Group::Binds(MountKind::Socket),
        Group::Links,
        Group::Libs(ElfClass::Lib64),
        Group::Libs(ElfClass::Lib32),
    ];

    fn flag(self) -> &'static str {
        match self {
            Group::Binds(MountKind::File) => "--bind-files",
            Group::Binds(MountKind::Dir) => "--bind-dirs",
            Group::Binds(MountKind::Socket) => "--bind-sockets",
            Group::Links => "--links",
            Group::Libs(ElfClass::Lib64) => "--lib64s",
            Group::Libs(ElfClass::Lib32) => "--lib32s",
        }
    }

    pub(super) fn of_flag(flag: &str) -> Option<Group> {
        Group::ALL.into_iter().find(|g| g.flag() == flag)
    }

    /// Adds the entries of `list` in `dir` to `out`; `None` where one is malformed. A bind's
    /// source is its path under `host_root` (`/` where there is none).
    pub(super) fn read(
        self,
        dir: &str,
        list: &str,
        host_root: Option<&str>,
        out: &mut LinkArgs,
    ) -> Option<()> {
        if !is_dir(dir) {
            return None;
        }
        for entry in list.split(',') {
            match self {
                Group::Binds(kind) => {
                    let destination = joined(dir, plain(entry)?);
                    out.mounts.push(Mount {
                        source: format!("{}{destination}", host_root.unwrap_or_default()).into(),
                        destination,
                        kind,
                    });
                }
                Group::Links => {
                    let (name, target) = entry.split_once('=')?;
                    out.symlinks.push(Symlink {
                        path: joined(dir, plain(name)?),
                        target: (!target.is_empty()).then(|| target.to_owned())?,
                    });
                }
                Group::Libs(class) => {
                    let (name, soname) = entry.split_once('=').unwrap_or((entry, entry));
                    out.ldcache.push(CacheEntry {
                        soname: plain(soname)?.to_owned(),
                        path: joined(dir, plain(name)?),
                        class,
                    });
                }
            }
        }
        Some(())
    }
}

/// The host directory most of `mounts`' sources are under, at their paths in the container;
/// none where that is `/`.
fn host_root(mounts: &[Mount]) -> Option<String> {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for mount in mounts {
        let Some(root) = root_of(mount) else { continue };
        match counts.iter_mut().find(|(r, _)| *r == root) {
            Some((_, n)) => *n += 1,
            None => counts.push((root, 1)),
        }
    }
    // The first of the most frequent.
    let (root, _) = counts.into_iter().rev().max_by_key(|(_, n)| *n)?;
    (!root.is_empty()).then(|| root.to_owned())
}

/// What `mount`'s source has before its path in the container: `""` where they are the same.
fn root_of(mount: &Mount) -> Option<&str> {
    let root = mount.source.to_str()?.strip_suffix(&mount.destination)?;
    (root.is_empty() || is_dir(root) && root != "/").then_some(root)
}

/// Writes `args`' bind mounts, links and loader-cache entries.
pub(super) fn write(args: &LinkArgs, out: &mut Vec<String>) {
    let root = host_root(&args.mounts);
    if let Some(root) = &root {
        out.extend(["--host-root".to_owned(), root.clone()]);
    }
    let root = root.as_deref().unwrap_or_default();
    let bind_key = |m: &Mount| {
        let (dir, name) = split(&m.destination)?;
        (root_of(m) == Some(root)).then(|| entry(Group::Binds(m.kind), dir, name.to_owned()))
    };
    write_runs(&args.mounts, bind_key, nested_mounts, out, |m, out| {
        out.extend([
            bind_flag(m.kind).to_owned(),
            m.source.display().to_string(),
            m.destination.clone(),
        ])
    });
    let link_key = |l: &Symlink| {
        let (dir, name) = split(&l.path)?;
        let groupable = !l.target.is_empty() && !l.target.contains(',');
        groupable.then(|| entry(Group::Links, dir, format!("{name}={}", l.target)))
    };
    write_runs(&args.symlinks, link_key, nested_links, out, |l, out| {
        out.extend(["--link".to_owned(), format!("{}={}", l.path, l.target)])
    });
    let lib_key = |e: &CacheEntry| {
        let (dir, name) = split(&e.path)?;
        let text = match plain(&e.soname)? == name {
            true => name.to_owned(),
            false => format!("{name}={}", e.soname),
        };
        Some(entry(Group::Libs(e.class), dir, text))
    };
    write_runs(&args.ldcache, lib_key, same_library, out, |e, out| {
        out.push(lib_flag(e.class).to_owned());
        // A compat library is named by its file (`libcuda.so.580.95.05`), not its SONAME.
        let by_soname =
            e.path.rsplit_once('/').map(|(_, n)| n) == Some(&e.soname) && !e.path.contains('=');
        out.push(match by_soname {
            true => e.path.clone(),
            false => format!("{}={}", e.path, e.soname),
        });
    });
}

/// An entry's group, the directory of the group, and the entry's text in it.
type Keyed = ((Group, String), String);

fn entry(group: Group, dir: &str, text: String) -> Keyed {
    ((group, dir.to_owned()), text)
}

/// `items` as groups where `key` gives one, and one by one through `single` where not.
fn write_runs<T>(
    items: &[T],
    key: impl Fn(&T) -> Option<Keyed>,
    depends: impl Fn(&T, &T) -> bool,
    out: &mut Vec<String>,
    single: impl Fn(&T, &mut Vec<String>),
) {
    let keyed = items.iter().map(|item| (key(item), item));
    let group_of = |(k, _): &(Option<Keyed>, &T)| k.as_ref().map(|(group, _)| group.clone());
    for (group, run) in runs(keyed, group_of, |(_, a), (_, b)| depends(a, b)) {
        match group {
            Some((group, dir)) => {
                let texts: Vec<String> = run.into_iter().filter_map(|(k, _)| Some(k?.1)).collect();
                out.extend([group.flag().to_owned(), dir, texts.join(",")]);
            }
            None => run.into_iter().for_each(|(_, item)| single(item, out)),
        }
    }
}

/// `items` as runs of one key each, in an order that a reader applying run after run cannot
/// tell from the items' own: an item joins the last run of its key only where no item of a
/// later run `depends` on it. Items with no key are runs of their own.
fn runs<T, K: PartialEq>(
    items: impl IntoIterator<Item = T>,
    key: impl Fn(&T) -> Option<K>,
    depends: impl Fn(&T, &T) -> bool,
) -> Vec<(Option<K>, Vec<T>)> {
    let mut out: Vec<(Option<K>, Vec<T>)> = Vec::new();
    for item in items {
        let k = key(&item);
        let joins = k.as_ref().and_then(|k| {
            let at = out.iter().rposition(|(run, _)| run.as_ref() == Some(k))?;
            out[at + 1..]
                .iter()
                .flat_map(|(_, later)| later)
                .all(|other| !depends(other, &item))
                .then_some(at)
        });
        match joins {
            Some(at) => out[at].1.push(item),
            None => out.push((k, vec![item])),
        }
    }
    out
}

/// What is mounted at one hides what is at the other, or is made inside it.
fn nested_mounts(a: &Mount, b: &Mount) -> bool {
    nested(&a.destination, &b.destination)
}

fn nested_links(a: &Symlink, b: &Symlink) -> bool {
    nested(&a.path, &b.path)
}

/// Of two entries for one SONAME, the loader takes the first.
fn same_library(a: &CacheEntry, b: &CacheEntry) -> bool {
    a.soname == b.soname && a.class == b.class
}

/// One path is the other or under it: what is made at one can hide or be hidden by the other.
fn nested(a: &str, b: &str) -> bool {
    let under = |inner: &str, outer: &str| {
        inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    under(a, b) || under(b, a)
}

/// `path`'s directory and name, where [`joined`] gives `path` back and the name can stand in
/// a group.
fn split(path: &str) -> Option<(&str, &str)> {
    let (dir, name) = path.rsplit_once('/')?;
    let dir = if dir.is_empty() { "/" } else { dir };
    (is_dir(dir) && plain(name).is_some()).then_some((dir, name))
}

fn joined(dir: &str, name: &str) -> String {
    match dir {
        "/" => format!("/{name}"),
        _ => format!("{dir}/{name}"),
    }
}

/// An absolute directory written without a trailing `/`.
fn is_dir(dir: &str) -> bool {
    dir.starts_with('/') && (dir == "/" || !dir.ends_with('/'))
}

/// `name` where it is one file's name that a group's separators leave whole.
fn plain(name: &str) -> Option<&str> {
    let ok = !name.is_empty() && name != "." && name != ".." && !name.contains(['/', ',', '=']);
    ok.then_some(name)
}

/// The flag of one bind mount of `kind`'s.
pub(super) fn bind_flag(kind: MountKind) -> &'static str {
    match kind {
        MountKind::File => "--bind-file",
        MountKind::Dir => "--bind-dir",
        MountKind::Socket => "--bind-socket",
    }
}

fn lib_flag(class: ElfClass) -> &'static str {
    match class {
        ElfClass::Lib64 => "--lib64",
        ElfClass::Lib32 => "--lib32",
    }
}

#[cfg(test)]
impl LinkArgs {
    /// `self` does what `other` does: the same entries, each list in an order that keeps
    /// every two dependent entries as `other` has them.
    pub(crate) fn applies_like(&self, other: &LinkArgs) -> bool {
        let rest = |args: &LinkArgs| LinkArgs {
            mounts: Vec::new(),
            symlinks: Vec::new(),
            ldcache: Vec::new(),
            ..args.clone()
        };
        reordered_alike(&other.mounts, &self.mounts, nested_mounts)
            && reordered_alike(&other.symlinks, &self.symlinks, nested_links)
            && reordered_alike(&other.ldcache, &self.ldcache, same_library)
            && rest(self) == rest(other)
    }
}

/// `b` holds `a`'s items, with each two that `depends` relates in `a`'s order.
#[cfg(test)]
fn reordered_alike<T: PartialEq>(a: &[T], b: &[T], depends: impl Fn(&T, &T) -> bool) -> bool {
    let mut used = vec![false; b.len()];
    let mut at = Vec::new();
    for item in a {
        let Some(i) = (0..b.len()).find(|&i| !used[i] && b[i] == *item) else {
            return false;
        };
        used[i] = true;
        at.push(i);
    }
    a.len() == b.len()
        && (0..a.len()).all(|i| (i + 1..a.len()).all(|j| !depends(&a[i], &a[j]) || at[i] < at[j]))
}
