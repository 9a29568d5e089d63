//! The hook of CDI specs and of nvhook-runtime's and the NRI plugin's cdi modes.
//!
//! The runtime has made the device nodes (and, with `cdi-mounts = "runtime"`, bind-mounted
//! the driver files); this hook makes the mounts left to it, the SONAME and `libcuda.so`
//! links, and the image's loader cache. It works before pivot_root in the container's mount
//! namespace: the specs nvhook writes now run it at `createRuntime`, from the runtime's
//! namespaces, and it enters the container's by the state's pid, as the prestart hook does;
//! specs written before ran it at `createContainer`, where the runtime starts it in the
//! container's namespace already. There it opens `root.path` with pathrs and works relative
//! to that. What to do comes in its arguments, because a static spec cannot point at a
//! per-container plan file, and arguments show in the spec for review.

use super::dir_groups::{DirGroup, could_be_in_trees, dir_groups};
use super::kept_trees::KeptTrees;
use super::nvidia_hooks;
use super::step::Step;
use super::userns::ContainerRoot;
use super::{HookError, container_mounts, effects, procfs, userns};
use crate::config::{Config, CudaCompatMode};
use crate::delivery::PrepareError;
use crate::delivery::hook_args::{LibFolder, LinkArgs};
use crate::inventory::gpu_layout::GpuLayout;
use crate::oci::{OciError, Spec, State};
use crate::plan::{CacheEntry, Symlink, compat};
use crate::proc_view;
use crate::request::CUDA_VERSION;
use crate::rootfs::{Rootfs, RootfsError, loader, sys};
use nvhook_ldcache::Arch;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// The OCI stage the spec runs the hook at, which says where the runtime starts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// In the runtime's namespaces, from the runtime's own process: the hook enters the
    /// container's mount namespace itself.
    CreateRuntime,
    /// In the container's mount namespace already, from the runtime's process there: runc
    /// writes this stage's state late, from `runc init` (docs/performance.md, twenty-sixth
    /// round), which is why nvhook's specs no longer use it.
    CreateContainer,
}

/// What the hook does before it reads the container's state, which none of it needs, so
/// that it does not wait for the state with nothing done.
pub struct BeforeState {
    stage: Stage,
    /// The driver files' sources (`cdi-mounts = "hook"`), in the order of the mounts: opened,
    /// or None where the file could be in a tree a copy of a kept one may give the container
    /// (opened on the visit to the runtime's mount namespace where no copy does).
    sources: Vec<Option<OwnedFd>>,
    /// The kept trees, at createRuntime where nvhook keeps state.
    kept: Option<KeptTrees>,
}

/// Checks the spec's GPU layout stamp and, where the hook makes mounts at createContainer,
/// that it runs in the container's own mount namespace; then opens the driver files'
/// sources, less those a kept tree may hold. Nothing of the container is touched.
pub fn before_state(
    config: &Config,
    args: &LinkArgs,
    stage: Stage,
) -> Result<BeforeState, HookError> {
    if let Some(written_for) = &args.gpu_layout {
        check_gpu_layout(config, written_for)?;
    }
    if args.mounts.is_empty() {
        return Ok(BeforeState {
            stage,
            sources: Vec::new(),
            kept: None,
        });
    }
    // At createContainer the OCI spec runs this hook in the container's own mount namespace:
    // a runtime that ran it in its own would get the mounts on its side.
    if stage == Stage::CreateContainer
        && container_mounts::init_shares_our_root_mount().map_err(HookError::MountTables)?
    {
        return Err(HookError::HostMountNamespace);
    }
    // Opened in the runtime's mount namespace, which holds the store.
    let kept = (stage == Stage::CreateRuntime)
        .then(|| KeptTrees::open(config))
        .flatten();
    let deferred = match kept {
        Some(_) => could_be_in_trees(args),
        None => vec![false; args.mounts.len()],
    };
    let sources = (args.mounts.iter().zip(deferred))
        .map(|(mount, deferred)| (!deferred).then(|| effects::open_source(mount)).transpose())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(BeforeState {
        stage,
        sources,
        kept,
    })
}

/// Applies `args` to the rootfs of the container `state` describes, with what
/// [`before_state`] did; `cwd` is the directory the runtime started the hook in, and `step`
/// holds the steps of the hook's process before it, whose line this run's steps join.
pub fn create_container(
    config: &Config,
    state: &State,
    args: &LinkArgs,
    before: BeforeState,
    cwd: Option<&Path>,
    mut step: Step,
) -> Result<(), HookError> {
    let (rootfs_path, spec) = match crate::oci::load_spec(&state.bundle) {
        Ok(spec) => (
            spec.rootfs(&state.bundle).ok_or(PrepareError::NoRoot)?,
            Some(spec),
        ),
        Err(e) => (rootfs_without_spec(state, cwd, before.stage, e)?, None),
    };
    // Mounts under a shared rootfs would propagate to the host's view of it. The driver files
    // were asked for; the /proc view is an extra, skipped below.
    let shared = spec.as_ref().and_then(Spec::shared_rootfs_propagation);
    if let Some(p) = shared
        && !args.mounts.is_empty()
    {
        return Err(HookError::SharedRootfsForHookMounts(p.into()));
    }
    let pid = match before.stage {
        Stage::CreateRuntime => Some(container_pid(state)?),
        Stage::CreateContainer => None,
    };
    // Before the rootfs is written: a container refused for its limits is left as it was.
    if let Some(spec) = &spec {
        super::memory_limits::in_spec_hook(config, state, spec, pid)?;
    }
    step.done("request");
    let (container_root, container_ns) = match pid.map(enter_container).transpose()? {
        Some((root, ns)) => (Some(root), Some(ns)),
        None => (None, None),
    };
    let mounts = spec.as_ref().map(Spec::mount_points).unwrap_or_default();
    let rootfs = Rootfs::open(&rootfs_path)?.with_mounts(&mounts);
    // A directory the image lacks gets a tree (a copy of one kept on the host, or a tmpfs of
    // the container's own), where the files' mount points, the links and the directories
    // holding them cost the container's new layer nothing. Not where the image has the
    // directory (the tree would hide its files), nor in a user namespace of the container's
    // own, whose root would not own what the hook makes there.
    let trees = match container_root {
        Some(Some(_)) => Vec::new(),
        _ => one_tree_per_directory(&rootfs, dir_groups(args, |dir| rootfs.missing_from(dir))),
    };
    if container_root.is_some() {
        step.done("enter");
    }
    // Before the hook acts as the container's root: what it makes on the host is the host's.
    let mut sources = before.sources;
    let copies = match (&before.kept, pid.zip(container_ns.as_ref())) {
        (Some(kept), Some(container))
            if !trees.is_empty() || sources.iter().any(Option::is_none) =>
        {
            let copies = kept.visit(&trees, args, &mut sources, container)?;
            step.done("visit");
            copies
        }
        _ => trees.iter().map(|_| None).collect(),
    };
    if let Some(root) = container_root {
        effects::act_as_container_root(root)?;
    }
    if !args.mounts.is_empty() {
        mount_driver_files(&rootfs, args, &sources, (&trees, copies), &mut step)?;
    }
    // Which images have a glibc cache is only known now: a static spec serves them all.
    let image = rootfs.probe();
    let new_cache = !args.makes_cache && image.needs_cache_for(Arch::HOST, &args.ldcache);
    if new_cache {
        tracing::info!(
            "the image has no loader cache, and its loader does not look where the driver's libraries are: writing one"
        );
    }
    // CUDA compat is chosen by the image's own cache: one written only to reach the host's
    // files is no sign that the image expects its compat libraries to load.
    let image_cache = image.has_ldcache || args.makes_cache;
    let has_cache = image_cache || new_cache;
    step.done("image");
    let mut args = args.clone();
    for folder in &args.folders.clone() {
        add_folder(&rootfs, folder, &mut args);
    }
    // The directories an enable-cuda-compat hook listed, ahead of the folders' copies.
    let ahead = if args.makes_cache && config.cuda_compat == CudaCompatMode::Auto {
        nvidia_hooks::compat_entries(&rootfs)
    } else {
        Vec::new()
    };
    if args.makes_cache {
        nvidia_hooks::include_conf_dir(&rootfs)?;
    }
    // Written whether or not the image has a cache yet, as NVIDIA's hook does: the
    // update-ldcache hook after it makes one.
    if let Some(hook) = &args.compat_hook
        && config.cuda_compat == CudaCompatMode::Auto
        && let Some(conf) = nvidia_hooks::enable_cuda_compat(&rootfs, hook)
    {
        match loader::write_conf(&rootfs, &conf) {
            Err(e @ RootfsError::Volume { .. }) => {
                tracing::info!(path = %conf.path, "not written: {e}");
            }
            written => written?,
        }
    }
    if let Some(host) = &args.cuda_compat_host
        && config.cuda_compat == CudaCompatMode::Auto
        && let Some(found) = rootfs.cuda_compat(spec.as_ref().and_then(|s| s.env(CUDA_VERSION)))
    {
        // Each library's SONAME link names its host file.
        let links = args.symlinks.clone();
        let host_files: Vec<(&str, &str)> = links
            .iter()
            .filter_map(|l| Some((l.path.rsplit_once('/')?.1, l.target.as_str())))
            .collect();
        let (decision, conf) =
            compat::apply(&found, host, image_cache, &host_files, &mut args.ldcache);
        decision.log();
        args.ld_so_confs.splice(0..0, conf);
    }
    step.done("folders+compat");
    // The links of a tree's directory are made already.
    let links: Vec<Symlink> = (args.symlinks.iter().enumerate())
        .filter(|(i, _)| !trees.iter().any(|group| group.links.contains(i)))
        .map(|(_, link)| link.clone())
        .collect();
    loader::link_and_cache(
        &rootfs,
        &links,
        // The spec was generated on this host, for its architecture.
        Arch::HOST,
        (&args.ldcache, &ahead),
        &args.ld_so_confs,
        has_cache,
    )?;
    step.done("links+ldcache");
    tracing::info!(
        links = args.symlinks.len(),
        cache_entries = if has_cache { args.ldcache.len() } else { 0 },
        "links and loader cache done"
    );
    if args.application_profile {
        nvidia_hooks::application_profile(&rootfs);
    }
    let wanted = proc_view::choose(config.proc_driver_view, spec.as_ref()).view();
    if wanted && args.proc_view.is_some() && shared.is_some() {
        tracing::info!("the rootfs's propagation is shared: the /proc/driver/nvidia view skipped");
    }
    let wanted = wanted && shared.is_none();
    let applied = match &args.proc_view {
        Some(view) if wanted => {
            rootfs.resolve(procfs::TARGET).is_some()
                && procfs::apply(&rootfs, procfs::prepare(view)?)?
        }
        // NVIDIA's `disable-device-node-modification`: its `params` alone.
        None if wanted && args.params_view => {
            procfs::apply_params(&rootfs, &config.proc_path("driver/nvidia/params"))?
        }
        _ => true,
    };
    if !applied {
        // The runtime has mounted the container's procfs on the rootfs by now. On a node with
        // no kernel module loaded it has no /proc/driver/nvidia, and there is nothing to hide.
        tracing::info!("the container's procfs has no /proc/driver/nvidia: view skipped");
    }
    step.done("proc");
    Ok(())
}

/// The container's process the state names at createRuntime, checked to be in a mount
/// namespace other than the hook's, the runtime's: the mounts would be the host's otherwise.
fn container_pid(state: &State) -> Result<i32, HookError> {
    let pid = state.pid.filter(|&pid| pid > 0).ok_or(HookError::NoPid)?;
    if container_mounts::shares_our_mount_ns(pid)
        .map_err(|source| HookError::ContainerGone { pid, source })?
    {
        return Err(HookError::NotInAContainer { pid });
    }
    Ok(pid)
}

/// Enters the mount namespace of the container's process `pid` from the runtime's: its
/// rootfs is then at the path the spec gives, before pivot_root. Returns the container's
/// root, for what the hook creates there.
fn enter_container(pid: i32) -> Result<(Option<ContainerRoot>, File), HookError> {
    let root = userns::container_root(pid)?;
    let ns = effects::enter_mount_ns(pid)?;
    Ok((root, ns))
}

/// `trees` less any two that are one directory of the image under two names
/// (`/lib/firmware/nvidia` and `/usr/lib/firmware/nvidia` where `/lib` links to `usr/lib`): the
/// second tmpfs would hide the first. Their files are bound one by one.
fn one_tree_per_directory(rootfs: &Rootfs, trees: Vec<DirGroup>) -> Vec<DirGroup> {
    if trees.len() < 2 {
        return trees;
    }
    // The deepest directory the image has above a tree, by its inode, and the path from it.
    let place = |group: &DirGroup| {
        let (above, _) = group.lacking.rsplit_once('/')?;
        let have = rootfs
            .dir_if_exists(if above.is_empty() { "/" } else { above })
            .ok()?;
        let st = sys::fstat(have.as_fd()).ok()?;
        Some((st.st_dev, st.st_ino, group.dir[above.len()..].to_string()))
    };
    let places: Vec<_> = trees.iter().map(place).collect();
    (trees.into_iter().zip(&places))
        .filter(|(_, at)| at.is_some() && places.iter().filter(|other| other == at).count() == 1)
        .map(|(group, _)| group)
        .collect()
}

/// The driver files' bind mounts a spec leaves to this hook (`cdi-mounts = "hook"`): each
/// source, opened by [`before_state`] as a detached read-only tree, attached at its target
/// inside the rootfs; for the directories in `trees`, the copy of its kept tree where there
/// is one, else the directory's own tmpfs holding its files and links: the steps `trees`, then
/// `mounts` for the files bound one by one.
fn mount_driver_files(
    rootfs: &Rootfs,
    args: &LinkArgs,
    sources: &[Option<OwnedFd>],
    (trees, copies): (&[DirGroup], Vec<Option<OwnedFd>>),
    step: &mut Step,
) -> Result<(), HookError> {
    // Each source not in a kept tree's copy was opened, before the state or on the visit.
    let opened = |i: usize| {
        sources[i].as_ref().ok_or_else(|| HookError::Source {
            path: args.mounts[i].source.clone(),
            source: std::io::Error::other("not opened in the runtime's mount namespace"),
        })
    };
    let kept = copies.iter().filter(|c| c.is_some()).count();
    for (group, copy) in trees.iter().zip(copies) {
        if let Some(copy) = copy {
            effects::attach_dir_in(rootfs, &copy, &group.dir)?;
            continue;
        }
        let files: Vec<(&str, &OwnedFd)> = (group.mounts.iter())
            .map(|&i| Ok((group.relative(&args.mounts[i].destination), opened(i)?)))
            .collect::<Result<_, HookError>>()?;
        let links: Vec<(&str, &str)> = (group.links.iter())
            .map(|&i| {
                let link = &args.symlinks[i];
                (group.relative(&link.path), link.target.as_str())
            })
            .collect();
        effects::tmpfs_tree_in(rootfs, &group.dir, &files, &links)?;
    }
    step.done("trees");
    for (i, mount) in args.mounts.iter().enumerate() {
        if !trees.iter().any(|group| group.mounts.contains(&i)) {
            effects::attach_in(rootfs, opened(i)?, mount)?;
        }
    }
    let in_trees: usize = trees.iter().map(|group| group.mounts.len()).sum();
    tracing::info!(
        mounts = args.mounts.len(),
        in_trees,
        trees = trees.len(),
        kept,
        "driver files mounted"
    );
    step.done("mounts");
    Ok(())
}

/// The rootfs of a container whose config.json the hook cannot read, where its runtime says
/// where the rootfs is (see [`userns::rootfs_from_runtime`]):
/// - at createContainer, run as the container's root in its user namespace, the hook may not
///   enter the bundle (Podman's is open to the host's root only);
/// - crun names its working directory as the bundle, which for a container in a user
///   namespace of Podman's is `/`, and the root it names (an intermediate mount of Podman's)
///   is the rootfs in the container's mount namespace.
///
/// Without the spec, no mount but the rootfs's own is written on, and the image's
/// `CUDA_VERSION` is not known. Any other failure is the error.
fn rootfs_without_spec(
    state: &State,
    cwd: Option<&Path>,
    stage: Stage,
    e: OciError,
) -> Result<std::path::PathBuf, HookError> {
    let unreadable =
        |kind| matches!(&e, OciError::ReadSpec { source, .. } if source.kind() == kind);
    let runtime_knows = match stage {
        Stage::CreateContainer => {
            unreadable(std::io::ErrorKind::PermissionDenied) && userns::in_user_namespace()
        }
        Stage::CreateRuntime => unreadable(std::io::ErrorKind::NotFound) && state.root.is_some(),
    };
    let parent = i32::try_from(std::os::unix::process::parent_id()).unwrap_or_default();
    if runtime_knows && let Some(rootfs) = userns::rootfs_from_runtime(state, cwd, parent) {
        tracing::info!(
            rootfs = %rootfs.display(),
            "{e}: the rootfs is the one the runtime names, and only its own mount is written on"
        );
        return Ok(rootfs);
    }
    Err(e.into())
}

/// Refuses a start through a static spec written for another GPU layout than the host's now:
/// its device names would give whatever they point at now. A layout that shows no GPU here
/// (this procfs is not the driver's) cannot be judged, and is logged.
fn check_gpu_layout(config: &Config, written_for: &str) -> Result<(), HookError> {
    let now = GpuLayout::read(config);
    if !now.has_gpus() {
        tracing::warn!(
            proc = %config.proc_path("driver/nvidia/gpus").display(),
            "no GPU in the driver's procfs here: the spec's GPU layout is not checked"
        );
        return Ok(());
    }
    if now.stamp() != written_for {
        return Err(HookError::StaleCdiSpec {
            written_for: written_for.to_owned(),
            now: now.stamp(),
        });
    }
    Ok(())
}

/// The SONAME links, and with `folder.cache` the loader-cache entries, of the libraries in
/// `folder`, added to `args`: what ldconfig would have made of the directory.
fn add_folder(rootfs: &Rootfs, folder: &LibFolder, args: &mut LinkArgs) {
    let dir = folder.dir.trim_end_matches('/');
    let libraries = rootfs.libraries_in(&folder.dir);
    tracing::info!(
        dir,
        libraries = libraries.len(),
        cache = folder.cache,
        "libraries of a folder"
    );
    if folder.cache {
        // ldconfig caches the `.so` links for ld(1) under their own names.
        for link in rootfs.dev_links_in(&folder.dir, &libraries) {
            args.ldcache.push(CacheEntry {
                path: format!("{dir}/{}", link.0),
                soname: link.0,
                class: link.1,
            });
        }
    }
    for lib in libraries {
        let path = format!("{dir}/{}", lib.soname);
        if lib.soname != lib.file {
            args.symlinks.push(Symlink {
                path: path.clone(),
                target: lib.file,
            });
        }
        if folder.cache {
            args.ldcache.push(CacheEntry {
                soname: lib.soname,
                path,
                class: lib.class,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A proc root whose `driver/nvidia` has `gpus` (bus ids) and the paths `capabilities`
    /// (MIG instances) under `capabilities`: what [`GpuLayout::read`] reads.
    fn proc_root(gpus: &[&str], capabilities: &[&str]) -> (tempfile::TempDir, Config) {
        let dir = tempfile::tempdir().expect("a proc root");
        let nvidia = dir.path().join("driver/nvidia");
        for bus in gpus {
            std::fs::create_dir_all(nvidia.join("gpus").join(bus)).unwrap();
        }
        for path in capabilities {
            std::fs::create_dir_all(nvidia.join("capabilities").join(path)).unwrap();
        }
        let config = Config {
            proc_root: dir.path().to_path_buf(),
            ..Config::default()
        };
        (dir, config)
    }

    const GPUS: [&str; 2] = ["0000:3b:00.0", "0000:86:00.0"];
    const MIG: [&str; 3] = ["gpu0/mig/gi1/ci0", "gpu0/mig/gi2/ci0", "gpu1/mig"];

    #[test]
    fn a_spec_stamped_for_another_gpu_layout_is_refused_in_one_line() {
        // The stamp of the layout the spec was written for: GPU 0 split in two instances.
        let (_before, config) = proc_root(&GPUS, &MIG);
        let written_for = GpuLayout::read(&config).stamp();
        // The same node now, GPU 0's instances remade as one (`nvidia-smi mig -dgi; -cgi`).
        let (_now, config) = proc_root(&GPUS, &["gpu0/mig/gi3/ci0", "gpu1/mig"]);
        let now = GpuLayout::read(&config).stamp();
        assert_ne!(now, written_for);
        let e = check_gpu_layout(&config, &written_for).unwrap_err();
        let HookError::StaleCdiSpec {
            written_for: said_for,
            now: said_now,
        } = &e
        else {
            panic!("not a stale-spec refusal: {e:?}");
        };
        assert_eq!((said_for, said_now), (&written_for, &now));
        let line = e.to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.contains(&format!("GPU layout {written_for}, now {now}")),
            "{line}"
        );
        assert!(line.contains("run `nvhook cdi refresh`"), "{line}");
        // The start stops there, before the runtime's state is even read.
        let args = LinkArgs {
            gpu_layout: Some(written_for.clone()),
            ..LinkArgs::default()
        };
        let Err(e) = before_state(&config, &args, Stage::CreateRuntime) else {
            panic!("a stale spec passed the checks before the state");
        };
        assert!(matches!(e, HookError::StaleCdiSpec { .. }), "{e:?}");
        // A GPU gone is another layout too.
        let (_gone, config) = proc_root(&GPUS[..1], &MIG);
        assert!(matches!(
            check_gpu_layout(&config, &written_for),
            Err(HookError::StaleCdiSpec { .. })
        ));
    }

    #[test]
    fn a_spec_stamped_for_the_gpu_layout_of_now_is_accepted() {
        let (_root, config) = proc_root(&GPUS, &MIG);
        let stamp = GpuLayout::read(&config).stamp();
        check_gpu_layout(&config, &stamp).expect("the layout the spec was written for");
        // Read again from another directory with the same entries: the stamp is the layout's,
        // not the directory's.
        let (_again, config) = proc_root(&GPUS, &MIG);
        check_gpu_layout(&config, &stamp).expect("the same layout");
    }

    #[test]
    fn a_proc_root_with_no_gpu_cannot_judge_a_stamp() {
        let (_with_gpus, config) = proc_root(&GPUS, &MIG);
        let stamp = GpuLayout::read(&config).stamp();
        // No driver procfs at all (a simulated node's host procfs), or one that lists no GPU.
        for (gpus, capabilities) in [(&[][..], &[][..]), (&[][..], &MIG[..])] {
            let (_root, config) = proc_root(gpus, capabilities);
            assert!(!GpuLayout::read(&config).has_gpus());
            check_gpu_layout(&config, &stamp).expect("no GPU here: not judged");
        }
    }
}
