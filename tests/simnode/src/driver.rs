//! The driver root: what an NVIDIA driver installation puts on a host's `/`.

use crate::compile;
use crate::libs::{self, LIBRARIES, NVML};
use crate::machine::Toolchain;
use crate::spec::{Gpu, Params, cuda_driver_version};
use crate::{tools, topology};
use anyhow::{Context, Result, bail};
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::Command;

const SOCKETS: &[&str] = &["run/nvidia-persistenced", "run/nvidia-fabricmanager"];

pub fn build(
    root: &Path,
    toolchain: &Toolchain,
    params: &Params,
    gpus: &[Gpu],
    mock_nvml: &Path,
    caps_major: u32,
    firmware_path: Option<&str>,
) -> Result<()> {
    let version = &params.driver_version;
    let dirs = [
        Some(toolchain.lib_dir()),
        toolchain.lib_dir_32(),
        Some(tools::BIN_DIR),
        Some("etc"),
    ];
    for dir in dirs.into_iter().flatten() {
        mkdir(&root.join(dir))?;
    }
    let smi = tools::smi_source(version, &params.cuda_version, gpus, |g| {
        format!("/dev/nvidia{}", g.minor)
    });
    let cuda = cuda_driver_version(&params.cuda_version)?;
    let scratch = root.join(".build");
    mkdir(&scratch)?;
    let libc32_stub = scratch.join("libc.so.6");
    if toolchain.lib_dir_32().is_some() {
        compile::run_all(toolchain, vec![libs::libc32_stub_job(&libc32_stub)])?;
    }
    let dirs = (toolchain.lib_dir(), toolchain.lib_dir_32());
    let mut jobs = libs::jobs(root, version, cuda, dirs, &libc32_stub);
    jobs.extend(libs::xorg_jobs(root, version));
    jobs.extend(tools::jobs(root, version, &smi));
    compile::run_all(toolchain, jobs)?;
    fs::remove_dir_all(&scratch).with_context(|| format!("cannot remove {}", scratch.display()))?;

    let nvml_lib = LIBRARIES
        .iter()
        .find(|l| l.name == NVML)
        .expect("NVML is in the table");
    let lib64 = root.join(toolchain.lib_dir());
    fs::copy(mock_nvml, lib64.join(nvml_lib.file_name(version))).with_context(|| {
        format!(
            "cannot copy the mock NVML from {}: build it with `cargo build -p mock-nvml` or pass --mock-nvml",
            mock_nvml.display()
        )
    })?;
    write(
        &lib64.join(topology::FILE_NAME),
        &topology::render(params, gpus, root.parent().unwrap_or(root), caps_major)?,
    )?;

    firmware(root, version, firmware_path.unwrap_or("/lib/firmware"))?;
    graphics_configs(root)?;
    for dir in SOCKETS {
        socket(&root.join(dir))?;
    }
    loader_cache(root, toolchain, version)
}

/// `count` entries of other libraries added to the loader cache under `root`, as a real host's
/// cache lists every library of the system; none of them is a driver file, and their files are
/// not made.
pub fn add_other_libraries(root: &Path, toolchain: &Toolchain, count: usize) -> Result<()> {
    use nvhook_ldcache::{Arch, ElfClass, Entry, LdCache};
    if count == 0 {
        return Ok(());
    }
    let path = root.join("etc/ld.so.cache");
    let bytes = fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut cache = LdCache::parse(&bytes).with_context(|| format!("bad {}", path.display()))?;
    let arch = match toolchain.arch {
        crate::machine::Arch::X86_64 => Arch::X86_64,
        crate::machine::Arch::Aarch64 => Arch::Aarch64,
    };
    for i in 0..count {
        let soname = format!("libsystem-component-{i}.so.{}", i % 9);
        let path = format!("/{}/{soname}", toolchain.arch.lib_dir());
        cache.insert(Entry::new(soname, path, arch, ElfClass::Lib64));
    }
    let bytes = cache.to_bytes().context("cannot write the loader cache")?;
    fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

fn mkdir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
}

fn write(path: &Path, text: &str) -> Result<()> {
    mkdir(path.parent().expect("files live in a directory"))?;
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

fn firmware(root: &Path, version: &str, dir: &str) -> Result<()> {
    let dir = root.join(dir.trim_start_matches('/'));
    for chip in ["ga10x", "tu10x"] {
        let path = dir.join(format!("nvidia/{version}/gsp_{chip}.bin"));
        write(
            &path,
            &format!("NVHOOK-SIM GSP firmware {chip} for driver {version}\n"),
        )?;
    }
    Ok(())
}

/// The graphics loaders' configs where Debian's driver packages put them, plus OpenCL's ICD
/// and OptiX's data file. Each JSON names its library by SONAME, as the driver's do.
fn graphics_configs(root: &Path) -> Result<()> {
    let icd = |key: &str, format: &str, library: &str| {
        format!(
            "{{\n    \"file_format_version\" : \"{format}\",\n    \"{key}\" : {{\n        \"library_path\" : \"{library}\"\n    }}\n}}\n"
        )
    };
    let files = [
        (
            "usr/share/vulkan/icd.d/nvidia_icd.json",
            icd("ICD", "1.0.1", "libGLX_nvidia.so.0"),
        ),
        (
            "usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
            icd("layer", "1.0.0", "libGLX_nvidia.so.0"),
        ),
        (
            "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
            icd("ICD", "1.0.0", "libEGL_nvidia.so.0"),
        ),
        (
            "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
            icd("ICD", "1.0.0", "libnvidia-egl-gbm.so.1"),
        ),
        (
            "usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
            icd("ICD", "1.0.0", "libnvidia-egl-wayland.so.1"),
        ),
        (
            "usr/share/X11/xorg.conf.d/10-nvidia.conf",
            "Section \"OutputClass\"\n    Identifier \"nvidia\"\n    MatchDriver \"nvidia-drm\"\n    Driver \"nvidia\"\nEndSection\n".into(),
        ),
        (
            "usr/share/nvidia/nvoptix.bin",
            "NVHOOK-SIM OptiX data\n".into(),
        ),
        ("etc/OpenCL/vendors/nvidia.icd", "libnvidia-opencl.so.1\n".into()),
    ];
    for (path, text) in files {
        write(&root.join(path), &text)?;
    }
    Ok(())
}

/// Leaves a real socket file at `dir/socket`. Binding through the directory's
/// /proc/self/fd link keeps the address short whatever the node's path
/// (sun_path holds 108 bytes).
fn socket(dir: &Path) -> Result<()> {
    mkdir(dir)?;
    let handle = fs::File::open(dir).with_context(|| format!("cannot open {}", dir.display()))?;
    let address = format!("/proc/self/fd/{}/socket", handle.as_raw_fd());
    UnixListener::bind(&address)
        .with_context(|| format!("cannot bind a Unix socket in {}", dir.display()))?;
    Ok(())
}

/// The node's ldconfig run over `root` as the node's own (`ldconfig -r`): SONAME links and
/// `etc/ld.so.cache` from `etc/ld.so.conf`; the ldconfig run.
pub fn run_ldconfig(root: &Path, toolchain: &Toolchain) -> Result<std::path::PathBuf> {
    let ldconfig = toolchain.ldconfig();
    let out = Command::new(&ldconfig)
        .arg("-r")
        .arg(root)
        .output()
        .with_context(|| format!("cannot run {}: install libc-bin", ldconfig.display()))?;
    if !out.status.success() {
        bail!(
            "{} -r {} failed: {}",
            ldconfig.display(),
            root.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(ldconfig)
}

/// ld.so.conf, SONAME links and a host-style ld.so.cache made by the real
/// ldconfig (of the node's architecture), then a check that the cache finds the libraries
/// nvhook needs.
fn loader_cache(root: &Path, toolchain: &Toolchain, version: &str) -> Result<()> {
    let arch = toolchain.arch;
    let conf: String = [Some(toolchain.lib_dir()), toolchain.lib_dir_32()]
        .into_iter()
        .flatten()
        .map(|dir| format!("/{dir}\n"))
        .collect();
    write(&root.join("etc/ld.so.conf"), &conf)?;
    let ldconfig = run_ldconfig(root, toolchain)?;
    let cache = root.join("etc/ld.so.cache");
    let listing = Command::new(&ldconfig)
        .arg("-C")
        .arg(&cache)
        .arg("-p")
        .output()
        .with_context(|| format!("cannot run {} -p", ldconfig.display()))?;
    let listing = String::from_utf8_lossy(&listing.stdout);
    for lib in ["nvidia-ml", "cuda"] {
        let soname = LIBRARIES
            .iter()
            .find(|l| l.name == lib)
            .expect("in table")
            .soname(version);
        let entry = format!("\t{soname} ({})", arch.cache_tag());
        if !listing.lines().any(|l| l.starts_with(&entry)) {
            bail!(
                "{} has no 64-bit {soname}: the library (for NVML: the --mock-nvml file) lacks that SONAME",
                cache.display()
            );
        }
    }
    Ok(())
}
