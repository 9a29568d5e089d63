//! The arguments of the hook of nvhook's CDI edits (`createRuntime`, `createContainer` before): the part of a plan the runtime cannot
//! apply itself (links, the loader cache, the `/proc/driver/nvidia` view, NVIDIA's compat
//! rule), written into a CDI spec or config.json by the delivery layer and read back by the
//! hook stage ([`crate::hook::create_container`]). A static spec cannot point at a plan file,
//! and arguments show in the spec for review.

use super::cdi_spec::ContainerEdits;
use crate::inventory::gpu_layout::GpuLayout;
use crate::plan::{CacheEntry, LdSoConf, Mount, MountKind, Plan, ProcOverlay, Symlink, compat};
use entries::{Group, bind_flag};
use nvhook_ldcache::ElfClass;

mod entries;

/// NVIDIA's `enable-cuda-compat` hook's input: the host versions its spec was written for, and
/// the image's compat directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompatHook {
    pub host_driver: Option<String>,
    pub host_cuda: Option<String>,
    pub dir: String,
}

/// The part of a plan the hook applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkArgs {
    /// The driver files' bind mounts, where the hook makes them (`cdi-mounts = "hook"`).
    pub mounts: Vec<Mount>,
    pub symlinks: Vec<Symlink>,
    pub ldcache: Vec<CacheEntry>,
    pub ld_so_confs: Vec<LdSoConf>,
    /// The host driver version a static spec was made for: the hook then decides about the
    /// image's CUDA compat libraries itself (a per-container plan has decided already).
    pub cuda_compat_host: Option<String>,
    /// The container's own `/proc/driver/nvidia` view, for a plan made for one container (nvhook-runtime's cdi
    /// mode, NRI); a static spec serves any set of devices and has none.
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
    "bad createContainer hook argument {0:?} (expected --host-root DIR, --bind-files|--bind-dirs|--bind-sockets DIR NAME,..., --links DIR NAME=TARGET,..., --lib64s|--lib32s DIR NAME[=SONAME],..., --bind-file|--bind-dir|--bind-socket HOST-PATH PATH, --link PATH=TARGET, --lib64 PATH[=SONAME], --lib32 PATH[=SONAME], --ld-so-conf FILE, --ld-so-dir DIR, --cuda-compat-host VERSION, --proc-driver DIR, --proc-gpu BUS-ID, --gpu-layout STAMP; regenerate the CDI spec with this nvhook)"
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
        self.mounts.is_empty()
            && self.symlinks.is_empty()
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
        entries::write(self, &mut out);
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
        // Named before the groups of bind mounts under it.
        let mut host_root: Option<&String> = None;
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
            if flag == "--host-root" {
                let first = host_root.is_none() && out.mounts.is_empty();
                host_root = Some(
                    Some(value)
                        .filter(|r| first && !r.ends_with('/'))
                        .ok_or_else(bad)?,
                );
                continue;
            }
            if let Some(group) = Group::of_flag(flag) {
                let list = it.next().ok_or_else(bad)?;
                group
                    .read(value, list, host_root.map(String::as_str), &mut out)
                    .ok_or_else(bad)?;
                continue;
            }
            if let Some(kind) = [MountKind::File, MountKind::Dir, MountKind::Socket]
                .into_iter()
                .find(|k| bind_flag(*k) == flag)
            {
                let destination = it.next().filter(|d| d.starts_with('/')).ok_or_else(bad)?;
                out.mounts.push(Mount {
                    source: value.into(),
                    destination: destination.clone(),
                    kind,
                });
                continue;
            }
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

/// The GPU layout stamp the hook of `edits` checks, if it has one (a spec
/// nvhook wrote).
pub fn gpu_layout_of(edits: &ContainerEdits) -> Option<&str> {
    edits.hooks.iter().find_map(|hook| {
        let at = hook.args.iter().position(|a| a == "--gpu-layout")?;
        hook.args.get(at + 1).map(String::as_str)
    })
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
            mounts: vec![
                Mount {
                    source: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15".into(),
                    destination: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15".into(),
                    kind: MountKind::File,
                },
                Mount {
                    source: "/lib/firmware/nvidia/550.54.15".into(),
                    destination: "/lib/firmware/nvidia/550.54.15".into(),
                    kind: MountKind::Dir,
                },
                Mount {
                    source: "/run/nvidia-persistenced/socket".into(),
                    destination: "/run/nvidia-persistenced/socket".into(),
                    kind: MountKind::Socket,
                },
            ],
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

    fn file(source: &str, destination: &str) -> Mount {
        Mount {
            source: source.into(),
            destination: destination.into(),
            kind: MountKind::File,
        }
    }

    fn lib(path: &str, soname: &str, class: ElfClass) -> CacheEntry {
        CacheEntry {
            soname: soname.into(),
            path: path.into(),
            class,
        }
    }

    fn link(path: &str, target: &str) -> Symlink {
        Symlink {
            path: path.into(),
            target: target.into(),
        }
    }

    /// A plan's lists go through its libraries, each in both of its directories; written,
    /// they are one group per directory, in a fraction of the strings and bytes.
    #[test]
    fn a_directory_s_entries_are_written_as_one_group() {
        let (x64, x86) = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu");
        let mut args = LinkArgs::default();
        for name in [
            "libcuda",
            "libnvidia-ml",
            "libnvidia-ptxjitcompiler",
            "libnvidia-nvvm",
        ] {
            for (dir, class) in [(x64, ElfClass::Lib64), (x86, ElfClass::Lib32)] {
                let path = format!("{dir}/{name}.so.550.54.15");
                args.mounts
                    .push(file(&format!("/run/nvidia/driver{path}"), &path));
                args.symlinks.push(link(
                    &format!("{dir}/{name}.so.1"),
                    &format!("{name}.so.550.54.15"),
                ));
                let soname = format!("{name}.so.1");
                args.ldcache
                    .push(lib(&format!("{dir}/{soname}"), &soname, class));
            }
        }
        // A file kept at another path in the container, and a name a group cannot hold.
        args.mounts.push(file(
            "/run/nvidia/driver/usr/share/vulkan/icd.d/nvidia_icd.json",
            "/etc/vulkan/icd.d/nvidia_icd.json",
        ));
        args.mounts
            .push(file("/run/nvidia/driver/usr/bin/a,b", "/usr/bin/a,b"));
        args.ldcache.push(lib(
            "/usr/local/cuda/compat/libcuda.so.580.95.05",
            "libcuda.so.1",
            ElfClass::Lib64,
        ));
        let written = args.to_args();
        let read = LinkArgs::parse(&written).unwrap();
        assert!(read.applies_like(&args), "{written:?}\n{read:?}");
        let count = |flag: &str| written.iter().filter(|a| *a == flag).count();
        assert_eq!(count("--host-root"), 1);
        assert_eq!((count("--bind-files"), count("--bind-file")), (2, 2));
        assert_eq!(
            (count("--links"), count("--lib64s"), count("--lib32s")),
            (2, 2, 1)
        );
        assert_eq!(written.len(), 2 + 2 * 3 + 2 * 3 + 2 * 3 + 3 * 3);
        assert!(written.contains(&"libcuda.so.550.54.15,libnvidia-ml.so.550.54.15,libnvidia-ptxjitcompiler.so.550.54.15,libnvidia-nvvm.so.550.54.15".to_owned()));
        // Sources at their paths in the container name no root.
        let at_home = LinkArgs {
            mounts: vec![file("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi")],
            ..LinkArgs::default()
        };
        let written = at_home.to_args();
        assert_eq!(written, ["--bind-files", "/usr/bin", "nvidia-smi"]);
        assert_eq!(LinkArgs::parse(&written).unwrap(), at_home);
    }

    /// An entry joins its directory's group only where nothing it depends on would then
    /// follow it: a mount inside a directory mounted before, or a second library of one
    /// SONAME, which the loader takes only when it is not the first.
    #[test]
    fn grouping_keeps_each_dependent_pair_in_its_order() {
        let args = LinkArgs {
            mounts: vec![
                file("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"),
                Mount {
                    source: "/opt/nv".into(),
                    destination: "/usr/bin/nv".into(),
                    kind: MountKind::Dir,
                },
                file("/usr/bin/nv", "/usr/bin/nv"),
                file("/usr/bin/nv/x", "/usr/bin/nv/x"),
            ],
            ldcache: vec![
                lib("/usr/lib/libcuda.so.1", "libcuda.so.1", ElfClass::Lib64),
                lib("/compat/libcuda.so.580", "libcuda.so.1", ElfClass::Lib64),
                lib("/usr/lib/libcuda.so.550", "libcuda.so.1", ElfClass::Lib64),
                lib(
                    "/usr/lib/libnvidia-ml.so.1",
                    "libnvidia-ml.so.1",
                    ElfClass::Lib64,
                ),
            ],
            ..LinkArgs::default()
        };
        let written = args.to_args();
        let read = LinkArgs::parse(&written).unwrap();
        assert_eq!(read, args, "{written:?}");
        assert_eq!(
            written.iter().filter(|a| *a == "--lib64s").count(),
            3,
            "{written:?}"
        );
        // Independent entries do move into their group.
        let mut free = args.clone();
        free.ldcache.remove(2);
        free.mounts.truncate(2);
        free.mounts.push(file(
            "/usr/bin/nvidia-debugdump",
            "/usr/bin/nvidia-debugdump",
        ));
        let read = LinkArgs::parse(&free.to_args()).unwrap();
        assert_ne!(read, free);
        assert!(read.applies_like(&free));
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
            &["--bind-file", "/usr/lib/libcuda.so.1"],
            &[
                "--bind-file",
                "/usr/lib/libcuda.so.1",
                "usr/lib/libcuda.so.1",
            ],
            &["--bind-dir", "lib/firmware", "/lib/firmware"],
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
            &["--bind-files", "/usr/lib"],
            &["--bind-files", "usr/lib", "libcuda.so.1"],
            &["--bind-files", "/usr/lib/", "libcuda.so.1"],
            &[
                "--bind-files",
                "/usr/lib",
                "libcuda.so.1,,libnvidia-ml.so.1",
            ],
            &["--bind-files", "/usr/lib", ""],
            &["--bind-dirs", "/lib/firmware", ".."],
            &["--bind-sockets", "/run", "nvidia/socket"],
            &["--links", "/usr/lib", "libcuda.so.1"],
            &["--links", "/usr/lib", "libcuda.so.1="],
            &["--links", "/usr/lib", "../libcuda.so.1=libcuda.so"],
            &["--lib64s", "/usr/lib", "libcuda.so.1=a/b"],
            &["--lib32s", "/usr/lib", "libcuda.so.1="],
            &["--host-root", "/"],
            &["--host-root", "/drv/"],
            &["--host-root", "drv"],
            &["--host-root", "/drv", "--host-root", "/drv"],
            &["--bind-files", "/usr/lib", "a", "--host-root", "/drv"],
        ] {
            let e = LinkArgs::parse(&strings(bad)).unwrap_err();
            assert!(e.to_string().contains("regenerate"), "{bad:?}: {e}");
        }
    }
}
