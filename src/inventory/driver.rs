//! The host driver's user-space files: libraries found through the driver root's
//! ld.so.cache, and binaries, firmware, IPC sockets and graphics configs found by path.

use super::graphics;
use super::host_file::{DriverRoot, is_elf};
use super::kept_files::{Kept, Key};
use super::{DriverFiles, HostFile, Library, Scope};
use crate::capability::Capability;
use crate::config::Config;
use crate::file_id::FileId;
use crate::whole_file::{read_kernel_text, read_sized};
use nvhook_ldcache::{self as ldcache, Arch, CacheFile, ElfClass, LdCache};
use std::cell::OnceCell;
use std::path::PathBuf;
use std::time::SystemTime;

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(
        "cannot read the driver root's loader cache {path}: {source} (is driver-root right, and has ldconfig run there?)"
    )]
    ReadCache {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad loader cache {path}: {source} (run ldconfig in the driver root)")]
    ParseCache {
        path: PathBuf,
        source: ldcache::LdCacheError,
    },
    #[error(
        "libnvidia-ml.so.1 is not in {cache} (is the NVIDIA driver installed? set nvml-library in the nvhook config)"
    )]
    NoNvml { cache: PathBuf },
}

/// The libraries each capability brings, by file-name stem (`<stem>.so.<driver version>`).
const LIBRARIES: &[(Capability, &[&str])] = &[
    (
        Capability::Utility,
        &["libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"],
    ),
    (
        Capability::Compute,
        &[
            "libcuda",
            "libcudadebugger",
            "libnvidia-opencl",
            "libnvidia-gpucomp",
            "libnvidia-ptxjitcompiler",
            "libnvidia-fatbinaryloader",
            "libnvidia-allocator",
            "libnvidia-compiler",
            "libnvidia-pkcs11",
            "libnvidia-pkcs11-openssl3",
            "libnvidia-nvvm",
        ],
    ),
    (
        Capability::Video,
        &[
            "libvdpau_nvidia",
            "libnvidia-encode",
            "libnvidia-opticalflow",
            "libnvcuvid",
        ],
    ),
    (
        Capability::Graphics,
        &[
            "libnvidia-eglcore",
            "libnvidia-glcore",
            "libnvidia-tls",
            "libnvidia-glsi",
            "libnvidia-fbc",
            "libnvidia-ifr",
            "libnvidia-rtcore",
            "libnvoptix",
            "libGLX_nvidia",
            "libEGL_nvidia",
            "libGLESv2_nvidia",
            "libGLESv1_CM_nvidia",
            "libnvidia-glvkspirv",
            "libnvidia-cbl",
            "libnvidia-vulkan-producer",
            // GBM's backend (`gbm/nvidia-drm_gbm.so`) is a link to it.
            "libnvidia-allocator",
            "libnvidia-egl-gbm",
            "libnvidia-egl-wayland",
            "libnvidia-egl-wayland2",
            "libnvidia-egl-xcb",
            "libnvidia-egl-xlib",
        ],
    ),
    (Capability::Ngx, &["libnvidia-ngx"]),
];

/// The EGL external platform libraries are released apart from the driver and carry their
/// own version (`libnvidia-egl-gbm.so.1.1.2`), not the driver's.
const OWN_VERSION: &[&str] = &[
    "libnvidia-egl-gbm",
    "libnvidia-egl-wayland",
    "libnvidia-egl-wayland2",
    "libnvidia-egl-xcb",
    "libnvidia-egl-xlib",
];

const BINARIES: &[(Capability, &str)] = &[
    (Capability::Utility, "nvidia-smi"),
    (Capability::Utility, "nvidia-debugdump"),
    (Capability::Utility, "nvidia-persistenced"),
    (Capability::Compute, "nvidia-cuda-mps-control"),
    (Capability::Compute, "nvidia-cuda-mps-server"),
];

/// Where driver binaries are looked for, in order. GKE-style installs keep the driver under
/// /usr/local/nvidia and put wrapper scripts in /usr/bin that exec the real binary there by
/// its host path, which a container does not have: only ELF files are taken.
const BINARY_DIRS: &[&str] = &["/usr/bin", "/bin", "/usr/sbin", "/usr/local/nvidia/bin"];

const SOCKETS: &[(Capability, &str)] = &[
    (Capability::Utility, "/run/nvidia-persistenced/socket"),
    (Capability::Utility, "/var/run/nvidia-persistenced/socket"),
    (Capability::Utility, "/run/nvidia-fabricmanager/socket"),
    (Capability::Utility, "/var/run/nvidia-fabricmanager/socket"),
    (Capability::Compute, "/tmp/nvidia-mps"),
];

/// The driver root's ld.so.cache. Its identity is taken when it is opened and its entries are
/// read at their first use: a start whose driver files are kept, with where NVML's library is
/// (while the cache is the file they were found in), reads none of it. A real node's cache
/// lists every library of the host, a thousand or more.
pub struct HostCache {
    path: PathBuf,
    /// The file as it was when opened.
    id: Option<FileId>,
    /// Its entries, once read.
    file: OnceCell<CacheFile>,
    /// `libnvidia-ml.so.1`'s entry, once looked up, or as a start before found it in this very
    /// file.
    nvml: OnceCell<String>,
    /// Whose entries are taken: the loader of this architecture's (the build target's).
    arch: Arch,
}

impl HostCache {
    pub fn open(config: &Config) -> Result<HostCache, DriverError> {
        let path = config.driver_path("etc/ld.so.cache");
        let meta = std::fs::metadata(&path).map_err(|source| DriverError::ReadCache {
            path: path.clone(),
            source,
        })?;
        Ok(HostCache {
            path,
            id: Some(FileId::of_metadata(&meta)),
            file: OnceCell::new(),
            nvml: OnceCell::new(),
            arch: Arch::HOST,
        })
    }

    /// The cache, taking NVML's library from `kept` where its search read this very file.
    pub(super) fn knowing(self, kept: Option<&Kept>) -> HostCache {
        if let Some(known) = kept.and_then(|k| k.nvml_entry(self.id.as_ref())) {
            let _ = self.nvml.set(known.to_owned());
        }
        self
    }

    /// The entries, read now if they were not yet. A file replaced since it was opened is read
    /// as it is now: a search made from it is kept under the identity taken at the open, which
    /// the next start's no longer matches, so that start searches again.
    fn file(&self) -> Result<&CacheFile, DriverError> {
        if let Some(file) = self.file.get() {
            return Ok(file);
        }
        let read = || -> std::io::Result<Vec<u8>> {
            let mut file = std::fs::File::open(&self.path)?;
            let size = file.metadata()?.len();
            read_sized(&mut file, size)
        };
        let bytes = read().map_err(|source| DriverError::ReadCache {
            path: self.path.clone(),
            source,
        })?;
        let file = CacheFile::new(bytes).map_err(|source| self.bad(source))?;
        Ok(self.file.get_or_init(|| file))
    }

    /// The architecture whose libraries this cache's entries are taken for.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The host path of `libnvidia-ml.so.1`, where NVML is loaded from by default.
    pub fn nvml_library(&self, config: &Config) -> Result<PathBuf, DriverError> {
        Ok(config.driver_path(&self.nvml_entry()?))
    }

    /// `libnvidia-ml.so.1`'s path as the cache lists it, in the driver root's terms.
    fn nvml_entry(&self) -> Result<String, DriverError> {
        if let Some(known) = self.nvml.get() {
            return Ok(known.clone());
        }
        let found = self
            .file()?
            .lookup("libnvidia-ml.so.1", self.arch, ElfClass::Lib64)
            .map_err(|source| self.bad(source))?
            .ok_or_else(|| DriverError::NoNvml {
                cache: self.path.clone(),
            })?;
        Ok(self.nvml.get_or_init(|| found.path).clone())
    }

    /// Every entry, in the loader's order.
    fn entries(&self) -> Result<LdCache, DriverError> {
        self.file()?.parse().map_err(|source| self.bad(source))
    }

    fn bad(&self, source: ldcache::LdCacheError) -> DriverError {
        DriverError::ParseCache {
            path: self.path.clone(),
            source,
        }
    }
}

/// Finds every driver file of version `version` under the driver root.
pub fn find_files(
    config: &Config,
    cache: &HostCache,
    version: &str,
    scope: Scope,
) -> Result<DriverFiles, DriverError> {
    find_files_kept(config, cache, version, scope, None)
}

/// [`find_files`], from `kept` when a search now would find the same files: it was made for
/// the same driver root, loader cache, driver version, scope and firmware directories, and
/// every directory its search looked into is as it was. Otherwise the search is made, and kept
/// there where it can be ([`Kept::of`]). The sockets are looked up every time: they come and
/// go with their daemons, in directories (`/run`, `/tmp`) that change all the time. With no
/// `kept`, nothing is recorded for keeping.
pub fn find_files_kept(
    config: &Config,
    cache: &HostCache,
    version: &str,
    scope: Scope,
    kept: Option<&mut Option<Kept>>,
) -> Result<DriverFiles, DriverError> {
    find_files_kept_at(config, cache, version, scope, kept, SystemTime::now())
}

/// [`find_files_kept`] at time `now`.
fn find_files_kept_at(
    config: &Config,
    cache: &HostCache,
    version: &str,
    scope: Scope,
    kept: Option<&mut Option<Kept>>,
    now: SystemTime,
) -> Result<DriverFiles, DriverError> {
    let root = DriverRoot::new(&config.driver_root, kept.is_some());
    let key = Key {
        driver_root: root.path().to_path_buf(),
        ld_cache: cache.id.clone(),
        version: version.to_string(),
        graphics: scope.graphics,
        firmware_dirs: firmware_dirs(config),
    };
    let mut files = match kept {
        Some(kept) => match kept.as_ref().and_then(|k| k.serves(&key)) {
            Some(files) => {
                tracing::debug!(
                    "the driver's files as a search before found them: nothing it read has changed"
                );
                files.clone()
            }
            None => {
                let files = search(&root, cache, &key)?;
                let nvml = cache.nvml_entry().ok();
                *kept = Kept::of(key, root.consulted(), &files, nvml, now);
                files
            }
        },
        None => search(&root, cache, &key)?,
    };
    files.sockets = SOCKETS
        .iter()
        .filter_map(|&(cap, p)| root.existing(p, Some(cap)))
        .collect();
    Ok(files)
}

/// The driver's files but the sockets, found under `root`.
fn search(root: &DriverRoot, cache: &HostCache, key: &Key) -> Result<DriverFiles, DriverError> {
    let scope = Scope {
        graphics: key.graphics,
    };
    let version = key.version.as_str();
    let configs = graphics::find_configs(root, scope);
    let config_library_paths = match scope.graphics {
        true => graphics::absolute_library_paths(&configs),
        false => Vec::new(),
    };
    Ok(DriverFiles {
        libraries: find_libraries(root, cache, version)?,
        binaries: BINARIES
            .iter()
            .filter_map(|&(cap, name)| {
                BINARY_DIRS.iter().find_map(|dir| {
                    root.existing(&format!("{dir}/{name}"), Some(cap))
                        .filter(|f| is_elf(&f.host_path))
                        .map(|f| HostFile {
                            container_path: format!("/usr/bin/{name}"),
                            ..f
                        })
                })
            })
            .collect(),
        firmware: find_firmware(root, &key.firmware_dirs, version),
        sockets: Vec::new(),
        configs,
        xorg_modules: match scope.graphics {
            true => graphics::find_xorg_modules(root, version, cache.arch),
            false => Vec::new(),
        },
        config_library_paths,
    })
}

fn find_libraries(
    root: &DriverRoot,
    cache: &HostCache,
    version: &str,
) -> Result<Vec<Library>, DriverError> {
    let mut out: Vec<Library> = Vec::new();
    for entry in cache.entries()?.entries() {
        for (stem, cap) in stems_of(&entry.soname) {
            if let Some(lib) = library(root, cache.arch, entry, stem, cap, version)
                && !out
                    .iter()
                    .any(|l| l.soname == lib.soname && l.class == lib.class && l.capability == cap)
            {
                out.push(lib);
            }
        }
    }
    out.sort_by(|a, b| (a.capability, &a.soname).cmp(&(b.capability, &b.soname)));
    Ok(out)
}

/// The library a cache entry names, when it is this driver's file.
fn library(
    root: &DriverRoot,
    arch: Arch,
    entry: &ldcache::Entry,
    stem: &str,
    capability: Capability,
    version: &str,
) -> Option<Library> {
    // Installers that ship the development link (`libcuda.so`, seen in the cache of a
    // real driver in /usr/local/nvidia/lib64) put it in the cache too: it names no
    // SONAME, and the plan makes `libcuda.so` itself.
    if entry.soname.len() == stem.len() + ".so".len() {
        return None;
    }
    // Another architecture's library (an armhf copy on arm64, say) is no class of ours.
    let class = arch.class_of(entry.flags)?;
    // A cache entry names the SONAME link; the versioned file behind it is what we mount.
    let host_path = root.canonical(&entry.path)?;
    let file_name = host_path.file_name()?.to_str()?.to_string();
    // Only this driver's files: a stale library of another version would not match the module.
    if !is_driver_file(&file_name, stem, version) {
        tracing::debug!(path = %host_path.display(), "skipping library of another driver version");
        return None;
    }
    Some(Library {
        capability,
        class,
        soname: entry.soname.clone(),
        file_name,
        host_path,
    })
}

/// `file_name` is `<stem>.so.<driver version>`, or for a library with a version of its own,
/// `<stem>.so.<any dotted version>`.
fn is_driver_file(file_name: &str, stem: &str, version: &str) -> bool {
    let Some(suffix) = file_name
        .strip_prefix(stem)
        .and_then(|rest| rest.strip_prefix(".so."))
    else {
        return false;
    };
    if OWN_VERSION.contains(&stem) {
        !suffix.is_empty()
            && suffix
                .split('.')
                .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    } else {
        suffix == version
    }
}

/// The library stem of a SONAME such as `libcuda.so.1`, with each capability it serves.
fn stems_of(soname: &str) -> impl Iterator<Item = (&'static str, Capability)> + '_ {
    let stem = soname.split_once(".so").map(|(stem, _)| stem);
    LIBRARIES.iter().filter_map(move |(cap, stems)| {
        stems.iter().find(|s| Some(**s) == stem).map(|s| (*s, *cap))
    })
}

/// Where the kernel looks for firmware, in its order: the custom path an administrator set
/// (`firmware_class.path`, e.g. a driver kept under /usr/local/nvidia), then the standard
/// directories, the running kernel's release first.
fn firmware_dirs(config: &Config) -> Vec<String> {
    let custom = read_kernel_text(&config.sys_path("module/firmware_class/parameters/path"))
        .ok()
        .map(|p| p.trim().trim_end_matches('/').to_string())
        .filter(|p| p.starts_with('/') && p.len() > 1);
    let release = read_kernel_text(&config.proc_path("sys/kernel/osrelease"))
        .ok()
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty() && !r.contains('/'));
    let mut dirs: Vec<String> = custom.into_iter().collect();
    for base in ["/lib/firmware/updates", "/lib/firmware"] {
        if let Some(release) = &release {
            dirs.push(format!("{base}/{release}"));
        }
        dirs.push(base.to_string());
    }
    dirs
}

/// This driver's GSP firmware, `<dir>/nvidia/<version>/gsp*.bin`: for each file name, the
/// one the kernel would load (the first directory that has it), at its host path.
fn find_firmware(root: &DriverRoot, dirs: &[String], version: &str) -> Vec<HostFile> {
    let mut out: Vec<HostFile> = Vec::new();
    for base in dirs {
        let dir = format!("{base}/nvidia/{version}");
        let Some(entries) = root.list(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let taken = out
                .iter()
                .any(|f| f.container_path.ends_with(&format!("/{name}")));
            if !name.starts_with("gsp") || !name.ends_with(".bin") || taken {
                continue;
            }
            out.extend(
                root.existing(&format!("{dir}/{name}"), None)
                    .filter(|f| f.host_path.is_file()),
            );
        }
    }
    out.sort_by(|a, b| a.container_path.cmp(&b.container_path));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The driver root `root`'s loader cache, holding `cache`'s entries.
    fn host_cache(root: &Path, id: Option<FileId>, cache: &LdCache, arch: Arch) -> HostCache {
        HostCache {
            path: root.join("etc/ld.so.cache"),
            id,
            file: OnceCell::from(CacheFile::new(cache.to_bytes().unwrap()).unwrap()),
            nvml: OnceCell::new(),
            arch,
        }
    }

    #[test]
    fn development_links_in_the_cache_are_not_sonames() {
        // The cache of a real 580 driver in /usr/local/nvidia/lib64 lists `libcuda.so` too.
        let root = tempfile::tempdir().unwrap();
        let lib_dir = root.path().join("usr/local/nvidia/lib64");
        std::fs::create_dir_all(&lib_dir).unwrap();
        let real = "libcuda.so.580.159.04";
        std::fs::write(lib_dir.join(real), b"").unwrap();
        let mut cache = LdCache::default();
        for name in ["libcuda.so", "libcuda.so.1"] {
            std::os::unix::fs::symlink(real, lib_dir.join(name)).unwrap();
            let path = format!("/usr/local/nvidia/lib64/{name}");
            cache.insert(ldcache::Entry::new(
                name,
                path,
                Arch::X86_64,
                ElfClass::Lib64,
            ));
        }
        let cache = host_cache(root.path(), None, &cache, Arch::X86_64);
        let found =
            find_libraries(&DriverRoot::new(root.path(), false), &cache, "580.159.04").unwrap();
        let names: Vec<&str> = found.iter().map(|l| l.soname.as_str()).collect();
        assert_eq!(names, ["libcuda.so.1"]);
        assert_eq!(found[0].file_name, real);
    }

    #[test]
    fn each_architecture_takes_its_own_libraries_from_the_cache() {
        // A driver root with the same driver for x86_64 and aarch64 (as a multiarch host
        // could have): each architecture's loader takes only its own entries.
        let root = tempfile::tempdir().unwrap();
        let mut cache = LdCache::default();
        for arch in [Arch::X86_64, Arch::Aarch64] {
            let dir = format!("/usr/lib/{}", arch.multiarch(ElfClass::Lib64));
            std::fs::create_dir_all(root.path().join(&dir[1..])).unwrap();
            for stem in ["libcuda", "libnvidia-ml"] {
                let real = format!("{stem}.so.580.1");
                std::fs::write(root.path().join(&dir[1..]).join(&real), b"").unwrap();
                let link = format!("{dir}/{stem}.so.1");
                std::os::unix::fs::symlink(&real, root.path().join(&link[1..])).unwrap();
                cache.insert(ldcache::Entry::new(
                    format!("{stem}.so.1"),
                    link,
                    arch,
                    ElfClass::Lib64,
                ));
            }
        }
        let config = Config {
            driver_root: root.path().to_path_buf(),
            ..Config::default()
        };
        for arch in [Arch::X86_64, Arch::Aarch64] {
            let host = host_cache(root.path(), None, &cache, arch);
            let found =
                find_libraries(&DriverRoot::new(root.path(), false), &host, "580.1").unwrap();
            let tuple = arch.multiarch(ElfClass::Lib64);
            let dir = root.path().join(format!("usr/lib/{tuple}"));
            assert_eq!(found.len(), 2, "{arch:?}: {found:?}");
            for lib in &found {
                assert_eq!(lib.class, ElfClass::Lib64);
                assert_eq!(lib.host_path.parent(), Some(dir.as_path()), "{lib:?}");
            }
            assert_eq!(
                host.nvml_library(&config).unwrap(),
                config.driver_path(&format!("/usr/lib/{tuple}/libnvidia-ml.so.1"))
            );
        }
    }

    /// A search kept between starts gives what a search now would give: a file added or
    /// removed, a rewritten loader cache, another driver version or a driver root that leads
    /// elsewhere each make a new search; a search of directories changed too recently to tell
    /// is not kept.
    #[test]
    fn a_kept_search_serves_only_while_what_it_read_is_unchanged() {
        let tmp = tempfile::tempdir().unwrap();
        let make_root = |name: &str| {
            let root = tmp.path().join(name);
            for dir in ["usr/bin", "etc", "lib/firmware/nvidia/580.1"] {
                std::fs::create_dir_all(root.join(dir)).unwrap();
            }
            std::fs::write(root.join("usr/bin/nvidia-smi"), b"\x7fELF").unwrap();
            std::fs::write(root.join("etc/ld.so.cache"), b"cache").unwrap();
            std::fs::write(root.join("lib/firmware/nvidia/580.1/gsp_ga10x.bin"), b"").unwrap();
            root
        };
        let first_root = make_root("a");
        let link = tmp.path().join("driver");
        std::os::unix::fs::symlink(&first_root, &link).unwrap();
        let config = Config {
            driver_root: link.clone(),
            proc_root: tmp.path().join("proc"),
            sys_root: tmp.path().join("sys"),
            ..Config::default()
        };
        let cache = |root: &Path| {
            let id = FileId::of(&root.join("etc/ld.so.cache"));
            host_cache(root, id, &LdCache::default(), Arch::HOST)
        };
        // Seen from a while after every change below: all of it settled.
        let later = SystemTime::now() + std::time::Duration::from_secs(60);
        let mut kept = None;
        let found = |kept: &mut Option<Kept>, root: &Path, version: &str, now| {
            let files =
                find_files_kept_at(&config, &cache(root), version, Scope::ALL, Some(kept), now)
                    .unwrap();
            let fresh = find_files(&config, &cache(root), version, Scope::ALL).unwrap();
            assert_eq!(files, fresh);
            files
        };
        let names = |files: &DriverFiles| -> Vec<String> {
            let binaries = files.binaries.iter().map(|f| f.container_path.clone());
            let firmware = files.firmware.iter().map(|f| f.container_path.clone());
            binaries.chain(firmware).collect()
        };

        found(&mut kept, &first_root, "580.1", SystemTime::now());
        assert!(kept.is_none(), "directories made just now were kept");
        found(&mut kept, &first_root, "580.1", later);
        assert!(kept.is_some(), "a settled search was not kept");
        let served = found(&mut kept, &first_root, "580.1", later);
        assert_eq!(
            names(&served),
            [
                "/usr/bin/nvidia-smi",
                "/lib/firmware/nvidia/580.1/gsp_ga10x.bin"
            ]
        );

        std::fs::write(first_root.join("usr/bin/nvidia-debugdump"), b"\x7fELF").unwrap();
        let added = found(&mut kept, &first_root, "580.1", later);
        assert!(names(&added).contains(&"/usr/bin/nvidia-debugdump".to_string()));
        std::fs::remove_file(first_root.join("lib/firmware/nvidia/580.1/gsp_ga10x.bin")).unwrap();
        let removed = found(&mut kept, &first_root, "580.1", later);
        assert!(removed.firmware.is_empty(), "{removed:?}");

        let rewritten = first_root.join("etc/ld.so.cache.new");
        std::fs::write(&rewritten, b"cache 2").unwrap();
        std::fs::rename(&rewritten, first_root.join("etc/ld.so.cache")).unwrap();
        found(&mut kept, &first_root, "580.1", later);
        found(&mut kept, &first_root, "580.2", later);

        let second_root = make_root("b");
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&second_root, &link).unwrap();
        let moved = found(&mut kept, &second_root, "580.1", later);
        assert!(
            moved.binaries[0]
                .host_path
                .starts_with(second_root.canonicalize().unwrap())
        );
    }

    /// A kept search names NVML's library as the loader cache it read lists it: while the cache
    /// is that very file, a start takes it from there and reads none of the cache; once the
    /// cache is another file, it is read again.
    #[test]
    fn nvml_s_library_is_taken_from_a_kept_search_of_the_same_loader_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let dir = format!("/usr/lib/{}", Arch::HOST.multiarch(ElfClass::Lib64));
        std::fs::create_dir_all(root.join(&dir[1..])).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        let entry = format!("{dir}/libnvidia-ml.so.1");
        let mut cache = LdCache::default();
        cache.insert(ldcache::Entry::new(
            "libnvidia-ml.so.1",
            entry.clone(),
            Arch::HOST,
            ElfClass::Lib64,
        ));
        let cache_path = root.join("etc/ld.so.cache");
        std::fs::write(&cache_path, cache.to_bytes().unwrap()).unwrap();
        let config = Config {
            driver_root: root.to_path_buf(),
            proc_root: root.join("proc"),
            sys_root: root.join("sys"),
            ..Config::default()
        };
        let later = SystemTime::now() + std::time::Duration::from_secs(60);
        let mut kept = None;
        let opened = HostCache::open(&config).unwrap();
        find_files_kept_at(
            &config,
            &opened,
            "580.1",
            Scope::ALL,
            Some(&mut kept),
            later,
        )
        .unwrap();
        let kept = kept.expect("a settled search is kept");

        // Opened, then rewritten in place with what no loader could read: the cache as opened
        // is the one the search read, so nothing of it is read.
        let opened = HostCache::open(&config).unwrap().knowing(Some(&kept));
        std::fs::write(&cache_path, b"not a loader cache").unwrap();
        assert_eq!(
            opened.nvml_library(&config).unwrap(),
            config.driver_path(&entry)
        );
        // Opened now, it is another file: read, and refused.
        let reopened = HostCache::open(&config).unwrap().knowing(Some(&kept));
        assert!(matches!(
            reopened.nvml_library(&config),
            Err(DriverError::ParseCache { .. })
        ));
        // Without a kept search it is read too.
        assert!(
            HostCache::open(&config)
                .unwrap()
                .nvml_library(&config)
                .is_err()
        );
    }

    #[test]
    fn binaries_are_elf_files_and_wrapper_scripts_are_passed_over() {
        let root = tempfile::tempdir().unwrap();
        for dir in ["usr/bin", "usr/local/nvidia/bin", "etc"] {
            std::fs::create_dir_all(root.path().join(dir)).unwrap();
        }
        let wrapper = b"#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n";
        std::fs::write(root.path().join("usr/bin/nvidia-smi"), wrapper).unwrap();
        let real = root.path().join("usr/local/nvidia/bin/nvidia-smi");
        std::fs::write(&real, b"\x7fELF\x02\x01\x01").unwrap();
        std::fs::write(root.path().join("usr/bin/nvidia-debugdump"), b"\x7fELF").unwrap();
        let config = Config {
            driver_root: root.path().to_path_buf(),
            ..Config::default()
        };
        let cache = host_cache(root.path(), None, &LdCache::default(), Arch::HOST);
        let files = find_files(&config, &cache, "580.159.04", Scope::ALL).unwrap();
        let found: Vec<(&str, &Path)> = files
            .binaries
            .iter()
            .map(|f| (f.container_path.as_str(), f.host_path.as_path()))
            .collect();
        let root = std::fs::canonicalize(root.path()).unwrap();
        assert_eq!(
            found,
            [
                (
                    "/usr/bin/nvidia-smi",
                    real.canonicalize().unwrap().as_path()
                ),
                (
                    "/usr/bin/nvidia-debugdump",
                    root.join("usr/bin/nvidia-debugdump").as_path()
                ),
            ]
        );
    }

    #[test]
    fn stems_map_to_capabilities() {
        let stems = |soname| stems_of(soname).collect::<Vec<_>>();
        assert_eq!(stems("libcuda.so.1"), [("libcuda", Capability::Compute)]);
        assert_eq!(
            stems("libnvidia-ml.so.1"),
            [("libnvidia-ml", Capability::Utility)]
        );
        assert_eq!(
            stems("libGLX_nvidia.so.0"),
            [("libGLX_nvidia", Capability::Graphics)]
        );
        // GBM's backend needs the allocator that compute brings too.
        assert_eq!(
            stems("libnvidia-allocator.so.1"),
            [
                ("libnvidia-allocator", Capability::Compute),
                ("libnvidia-allocator", Capability::Graphics)
            ]
        );
        // A prefix is not a match: libcudart is the CUDA runtime, not the driver.
        assert!(stems("libcudart.so.12").is_empty());
        assert!(stems("libc.so.6").is_empty());
    }

    #[test]
    fn driver_files_carry_the_driver_version_or_their_own() {
        let v = "580.95.05";
        assert!(is_driver_file("libcuda.so.580.95.05", "libcuda", v));
        assert!(!is_driver_file("libcuda.so.550.54.15", "libcuda", v));
        assert!(!is_driver_file("libcuda.so.1", "libcuda", v));
        assert!(is_driver_file(
            "libnvidia-egl-gbm.so.1.1.2",
            "libnvidia-egl-gbm",
            v
        ));
        assert!(is_driver_file(
            "libnvidia-egl-wayland.so.1.1.19",
            "libnvidia-egl-wayland",
            v
        ));
        assert!(!is_driver_file(
            "libnvidia-egl-gbm.so.1.x",
            "libnvidia-egl-gbm",
            v
        ));
        assert!(!is_driver_file(
            "libnvidia-egl-gbm.so.",
            "libnvidia-egl-gbm",
            v
        ));
        assert!(!is_driver_file(
            "libnvidia-egl-gbm.so.1..2",
            "libnvidia-egl-gbm",
            v
        ));
    }

    #[test]
    fn firmware_is_found_where_the_kernel_looks_first() {
        let root = tempfile::tempdir().unwrap();
        let v = "580.159.04";
        let custom = root
            .path()
            .join(format!("usr/local/nvidia/firmware/nvidia/{v}"));
        let standard = root.path().join(format!("lib/firmware/nvidia/{v}"));
        for dir in [&custom, &standard] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(custom.join("gsp_ga10x.bin"), b"custom").unwrap();
        std::fs::write(standard.join("gsp_ga10x.bin"), b"standard").unwrap();
        std::fs::write(standard.join("gsp_tu10x.bin"), b"standard").unwrap();
        std::fs::write(standard.join("README"), b"not firmware").unwrap();
        let dirs = [
            "/usr/local/nvidia/firmware".to_string(),
            "/lib/firmware".into(),
        ];
        let found = find_firmware(&DriverRoot::new(root.path(), false), &dirs, v);
        let paths: Vec<&str> = found.iter().map(|f| f.container_path.as_str()).collect();
        assert_eq!(
            paths,
            [
                format!("/lib/firmware/nvidia/{v}/gsp_tu10x.bin"),
                format!("/usr/local/nvidia/firmware/nvidia/{v}/gsp_ga10x.bin"),
            ]
        );
    }
}
