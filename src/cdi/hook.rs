//! The `createContainer` hook of CDI specs and of the shim's cdi mode.
//!
//! The runtime has made the device nodes and bind-mounted the driver files; this hook makes
//! the SONAME and `libcuda.so` links and writes the image's loader cache. It runs in the
//! container's mount namespace before pivot_root, so it enters no namespace: it opens
//! `root.path` with pathrs and works relative to that, like the prestart hook does once it
//! has entered the namespace. What to do comes in its arguments, because a static spec
//! cannot point at a per-container plan file, and arguments show in the spec for review.

use super::nvidia_hooks::{self, CompatHook};
use crate::config::{Config, CudaCompatMode};
use crate::inject::{HookError, procfs};
use crate::inventory::gpu_layout::GpuLayout;
use crate::oci::State;
use crate::plan::{CacheEntry, LdSoConf, Plan, ProcOverlay, Symlink, compat};
use crate::proc_view;
use crate::request::CUDA_VERSION;
use crate::rootfs::{Rootfs, RootfsError, loader};
use nvhook_ldcache::{Arch, ElfClass};

/// The part of a plan the hook applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkArgs {
    pub symlinks: Vec<Symlink>,
    pub ldcache: Vec<CacheEntry>,
    pub ld_so_confs: Vec<LdSoConf>,
    /// The host driver version a static spec was made for: the hook then decides about the
    /// image's CUDA compat libraries itself (a per-container plan has decided already).
    pub cuda_compat_host: Option<String>,
    /// The container's own `/proc/driver/nvidia` view, for a plan made for one container (the
    /// shim's cdi mode, NRI); a static spec serves any set of devices and has none.
    pub proc_view: Option<ProcOverlay>,
    /// Directories whose libraries get their SONAME links, and with `cache` loader-cache
    /// entries, found when the container starts (NVIDIA's `update-ldcache --folder` and
    /// `create-soname-symlinks --folder`, run as `nvidia-cdi-hook`).
    pub folders: Vec<LibFolder>,
    /// The container's `/proc/driver/nvidia/params` says `ModifyDeviceFiles: 0`, every GPU's
    /// directory kept (NVIDIA's `disable-device-node-modification`).
    pub params_view: bool,
    /// The [`GpuLayout`] stamp of the host a static spec was written for: a start through
    /// the spec on a host whose GPUs or MIG instances have changed since is refused.
    pub gpu_layout: Option<String>,
    /// NVIDIA's `enable-cuda-compat`, run as a hook of its own.
    pub compat_hook: Option<CompatHook>,
    /// A loader cache is made for an image without one, and the directories an
    /// `enable-cuda-compat` hook listed come first in it (NVIDIA's `update-ldcache`, whose
    /// ldconfig does both).
    pub makes_cache: bool,
    /// NVIDIA's `update-application-profile`.
    pub application_profile: bool,
}

/// A directory of the container whose libraries are linked and, with `cache`, cached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibFolder {
    pub dir: String,
    pub cache: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "bad createContainer hook argument {0:?} (expected --link PATH=TARGET, --lib64 PATH[=SONAME], --lib32 PATH[=SONAME], --ld-so-conf FILE, --ld-so-dir DIR, --cuda-compat-host VERSION, --proc-driver DIR, --proc-gpu BUS-ID, --gpu-layout STAMP; regenerate the CDI spec with this nvhook)"
)]
pub struct BadHookArg(pub String);

impl LinkArgs {
    pub fn from_plan(plan: &Plan) -> LinkArgs {
        LinkArgs {
            symlinks: plan.symlinks.clone(),
            // Cache entries only mean something for an image with a cache to add them to.
            ldcache: if plan.layout.ldcache {
                plan.ldcache.clone()
            } else {
                Vec::new()
            },
            ld_so_confs: plan.ld_so_confs.clone(),
            // Libraries at their host paths: the plan is a static spec's, for any image.
            cuda_compat_host: plan
                .layout
                .host_driver_root
                .is_some()
                .then(|| plan.driver_version.clone()),
            proc_view: plan.proc_overlay.clone(),
            ..LinkArgs::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.symlinks.is_empty()
            && self.ldcache.is_empty()
            && self.ld_so_confs.is_empty()
            && self.proc_view.is_none()
            && self.folders.is_empty()
            && !self.params_view
            && self.compat_hook.is_none()
            && !self.application_profile
    }

    pub fn to_args(&self) -> Vec<String> {
        let mut out = Vec::new();
        for link in &self.symlinks {
            out.push("--link".into());
            out.push(format!("{}={}", link.path, link.target));
        }
        for entry in &self.ldcache {
            out.push(
                match entry.class {
                    ElfClass::Lib64 => "--lib64",
                    ElfClass::Lib32 => "--lib32",
                }
                .into(),
            );
            // A compat library is named by its file (`libcuda.so.580.95.05`), not its SONAME.
            let by_soname = entry.path.rsplit_once('/').map(|(_, n)| n) == Some(&entry.soname)
                && !entry.path.contains('=');
            out.push(if by_soname {
                entry.path.clone()
            } else {
                format!("{}={}", entry.path, entry.soname)
            });
        }
        for conf in &self.ld_so_confs {
            out.push("--ld-so-conf".into());
            out.push(conf.path.clone());
            for dir in &conf.dirs {
                out.push("--ld-so-dir".into());
                out.push(dir.clone());
            }
        }
        if let Some(version) = &self.cuda_compat_host {
            out.push("--cuda-compat-host".into());
            out.push(version.clone());
        }
        if let Some(stamp) = &self.gpu_layout {
            out.push("--gpu-layout".into());
            out.push(stamp.clone());
        }
        if let Some(view) = &self.proc_view {
            out.push("--proc-driver".into());
            out.push(view.host_dir.display().to_string());
            for bus in &view.gpus {
                out.push("--proc-gpu".into());
                out.push(bus.clone());
            }
        }
        out
    }

    pub fn parse(args: &[String]) -> Result<LinkArgs, BadHookArg> {
        let mut out = LinkArgs::default();
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let bad = || BadHookArg(flag.clone());
            if flag == "--cuda-compat-host" && out.cuda_compat_host.is_none() {
                let version = it
                    .next()
                    .filter(|v| compat::DriverVersion::parse(v).is_some());
                out.cuda_compat_host = Some(version.ok_or_else(bad)?.clone());
                continue;
            }
            if flag == "--gpu-layout" && out.gpu_layout.is_none() {
                let stamp = it.next().filter(|s| GpuLayout::is_stamp(s));
                out.gpu_layout = Some(stamp.ok_or_else(bad)?.clone());
                continue;
            }
            // A PCI bus id (`00000000:3B:00.0`), of the directory named last.
            if flag == "--proc-gpu" {
                let bus = it.next().filter(|b| {
                    !b.is_empty()
                        && b.bytes()
                            .all(|c| c.is_ascii_hexdigit() || c == b':' || c == b'.')
                });
                let view = out.proc_view.as_mut().ok_or_else(bad)?;
                view.gpus.push(bus.ok_or_else(bad)?.clone());
                continue;
            }
            let value = it.next().filter(|v| v.starts_with('/')).ok_or_else(bad)?;
            match flag.as_str() {
                "--link" => {
                    let (path, target) = value.split_once('=').ok_or_else(bad)?;
                    out.symlinks.push(Symlink {
                        path: path.into(),
                        target: target.into(),
                    });
                }
                "--lib64" | "--lib32" => {
                    let (path, soname) = match value.rsplit_once('=') {
                        Some((path, soname)) => (path, soname),
                        None => (value.as_str(), value.rsplit_once('/').ok_or_else(bad)?.1),
                    };
                    if soname.is_empty() || soname.contains('/') {
                        return Err(bad());
                    }
                    out.ldcache.push(CacheEntry {
                        soname: soname.into(),
                        path: path.into(),
                        class: if flag == "--lib64" {
                            ElfClass::Lib64
                        } else {
                            ElfClass::Lib32
                        },
                    });
                }
                "--ld-so-conf" if !out.ld_so_confs.iter().any(|c| &c.path == value) => {
                    out.ld_so_confs.push(LdSoConf {
                        path: value.clone(),
                        dirs: Vec::new(),
                    })
                }
                "--proc-driver" if out.proc_view.is_none() => {
                    out.proc_view = Some(ProcOverlay {
                        host_dir: value.into(),
                        gpus: Vec::new(),
                    })
                }
                // The directories of the file named last.
                "--ld-so-dir" => out
                    .ld_so_confs
                    .last_mut()
                    .ok_or_else(bad)?
                    .dirs
                    .push(value.clone()),
                _ => return Err(bad()),
            }
        }
        Ok(out)
    }
}

/// The GPU layout stamp the createContainer hook of `edits` checks, if it has one (a spec
/// nvhook wrote).
pub fn gpu_layout_of(edits: &crate::cdi::ContainerEdits) -> Option<&str> {
    edits.hooks.iter().find_map(|hook| {
        let at = hook.args.iter().position(|a| a == "--gpu-layout")?;
        hook.args.get(at + 1).map(String::as_str)
    })
}

/// Applies `args` to the rootfs of the container `state` describes.
pub fn create_container(config: &Config, state: &State, args: &LinkArgs) -> Result<(), HookError> {
    if let Some(written_for) = &args.gpu_layout {
        check_gpu_layout(config, written_for)?;
    }
    let spec = crate::oci::load_spec(&state.bundle)?;
    let rootfs_path = spec.rootfs(&state.bundle).ok_or(HookError::NoRoot)?;
    let rootfs = Rootfs::open(&rootfs_path)?.with_mounts(&spec.mount_points());
    // Which images have a glibc cache is only known now: a static spec serves them all.
    let has_cache = rootfs.probe().has_ldcache || args.makes_cache;
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
        && let Some(found) = rootfs.cuda_compat(spec.env(CUDA_VERSION))
    {
        // Each library's SONAME link names its host file.
        let links = args.symlinks.clone();
        let host_files: Vec<(&str, &str)> = links
            .iter()
            .filter_map(|l| Some((l.path.rsplit_once('/')?.1, l.target.as_str())))
            .collect();
        let (decision, conf) =
            compat::apply(&found, host, has_cache, &host_files, &mut args.ldcache);
        decision.log();
        args.ld_so_confs.splice(0..0, conf);
    }
    loader::link_and_cache(
        &rootfs,
        &args.symlinks,
        // The spec was generated on this host, for its architecture.
        Arch::HOST,
        (&args.ldcache, &ahead),
        &args.ld_so_confs,
        has_cache,
    )?;
    tracing::info!(
        links = args.symlinks.len(),
        cache_entries = if has_cache { args.ldcache.len() } else { 0 },
        "links and loader cache done"
    );
    if args.application_profile {
        nvidia_hooks::application_profile(&rootfs);
    }
    let wanted = proc_view::choose(config.proc_driver_view, Some(&spec)).view();
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
    Ok(())
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

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_round_trip() {
        let args = LinkArgs {
            symlinks: vec![Symlink {
                path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                target: "libcuda.so.550.54.15".into(),
            }],
            ldcache: vec![
                CacheEntry {
                    soname: "libcuda.so.1".into(),
                    path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                    class: ElfClass::Lib64,
                },
                CacheEntry {
                    soname: "libcuda.so.1".into(),
                    path: "/usr/lib/i386-linux-gnu/libcuda.so.1".into(),
                    class: ElfClass::Lib32,
                },
                CacheEntry {
                    soname: "libnvidia-ptxjitcompiler.so.1".into(),
                    path: "/usr/local/cuda/compat/libnvidia-ptxjitcompiler.so.580.95.05".into(),
                    class: ElfClass::Lib64,
                },
            ],
            ld_so_confs: vec![
                LdSoConf {
                    path: "/etc/ld.so.conf.d/00-compat-nvhook.conf".into(),
                    dirs: strings(&["/usr/local/cuda/compat"]),
                },
                LdSoConf {
                    path: "/etc/ld.so.conf.d/000-nvhook.conf".into(),
                    dirs: strings(&["/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu"]),
                },
            ],
            cuda_compat_host: Some("550.54.15".into()),
            proc_view: Some(ProcOverlay {
                host_dir: "/proc/driver/nvidia".into(),
                gpus: strings(&["00000000:3B:00.0", "00000000:86:00.0"]),
            }),
            gpu_layout: Some("0123456789abcdef".into()),
            ..LinkArgs::default()
        };
        assert_eq!(LinkArgs::parse(&args.to_args()).unwrap(), args);
        assert_eq!(LinkArgs::parse(&[]).unwrap(), LinkArgs::default());
    }

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
        // The start stops there, before the bundle is even read (it does not exist).
        let state = State {
            id: "stale".into(),
            pid: Some(1),
            bundle: config.proc_root.join("no-such-bundle"),
        };
        let args = LinkArgs {
            gpu_layout: Some(written_for.clone()),
            ..LinkArgs::default()
        };
        let e = create_container(&config, &state, &args).unwrap_err();
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

    #[test]
    fn bad_arguments_are_refused() {
        for bad in [
            &["--link"][..],
            &["--link", "/a"],
            &["--lib64", "relative/libcuda.so.1"],
            &["--lib64", "/usr/lib/libcuda.so.1="],
            &["--lib64", "/usr/lib/libcuda.so.1=a/b"],
            &["--frobnicate", "/x"],
            &["--ld-so-dir", "/usr/lib"],
            &["--ld-so-conf", "/a", "--ld-so-conf", "/a"],
            &["--cuda-compat-host", "/550.54.15"],
            &["--cuda-compat-host", "latest"],
            &["--proc-gpu", "00000000:3B:00.0"],
            &["--proc-driver", "/proc/driver/nvidia", "--proc-gpu", "../x"],
            &["--proc-driver", "proc/driver/nvidia"],
            &["--gpu-layout", "0123"],
            &["--gpu-layout", "/usr/lib/x86_64-l"],
            &[
                "--gpu-layout",
                "0123456789abcdef",
                "--gpu-layout",
                "0123456789abcdef",
            ],
            &[
                "--cuda-compat-host",
                "550.54.15",
                "--cuda-compat-host",
                "550.54.15",
            ],
        ] {
            let e = LinkArgs::parse(&strings(bad)).unwrap_err();
            assert!(e.to_string().contains("regenerate"), "{bad:?}: {e}");
        }
    }
}
