//! A WSL2 guest's GPU side (`simnode create --wsl`): no NVIDIA kernel module, no `/dev/nvidia*`
//! and no `/proc/driver/nvidia`; one `/dev/dxg` for every GPU, Microsoft's `libdxcore.so` in
//! `/usr/lib/wsl/lib`, and NVIDIA's driver store mapped in from Windows under
//! `/usr/lib/wsl/drivers`, whose NVML (the mock) reports GPUs without minor numbers.

use crate::compile::{self, Job};
use crate::libs::{LIBRARIES, marker_source};
use crate::machine::Toolchain;
use crate::procfs::put;
use crate::spec::{Gpu, Params, cuda_driver_version};
use crate::{tools, topology};
use anyhow::{Context, Result};
use std::fs;
use std::path::Path;

/// The misc major, which `/dev/dxg` is registered under.
const MISC_MAJOR: u32 = 10;
/// dxgkrnl registers `/dev/dxg` with a dynamic misc minor, so its number depends on the kernel
/// and what registered before it; the kernel's older allocator hands them out from 63 down.
/// The node takes the first of those this host's misc driver does not serve, so that an open
/// the cgroup allows meets no driver (ENODEV), as every simulated node's devices do.
const DYNAMIC_MINOR_TOP: u32 = 63;
/// NVIDIA's display driver package, as Windows names its store directory.
pub const STORE: &str = "usr/lib/wsl/drivers/nv_dispi.inf_amd64_3a0b4e5d7c9f2e18";
/// Another vendor's package, which holds no libcuda: not NVIDIA's store.
const OTHER_STORE: &str = "usr/lib/wsl/drivers/iigd_dch.inf_amd64_5c2e7a9d0b3f1e44";
const LIB_DIR: &str = "usr/lib/wsl/lib";
/// What a WSL2 kernel reports (`uname -r`).
const KERNEL_RELEASE: &str = "5.15.167.4-microsoft-standard-WSL2\n";

/// Shared libraries of NVIDIA's store (besides libcuda and NVML), with their SONAMEs: the ones
/// NVIDIA's toolkit requires, and one it takes since 1.20 as any `*.so*` there.
const STORE_LIBRARIES: &[&str] = &[
    "libcuda_loader.so",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-ml_loader.so",
    "libnvdxgdmal.so.1",
    "libnvwgf2umx.so",
];
/// Data files of the store: the two a container gets (`.bin`, `.dll`), then the driver
/// package's own, which it does not.
const STORE_DATA: &[&str] = &[
    "nvcubins.bin",
    "nvapi64.dll",
    "nv_dispi.inf",
    "nvlddmkm.sys",
];

/// Builds the node's driver root, dev, proc and sys under `dir`.
pub fn build(
    dir: &Path,
    toolchain: &Toolchain,
    params: &Params,
    gpus: &[Gpu],
    mock_nvml: &Path,
) -> Result<()> {
    let root = dir.join("driver");
    let store = root.join(STORE);
    let version = &params.driver_version;
    let cuda = LIBRARIES
        .iter()
        .find(|l| l.name == "cuda")
        .expect("libcuda is in the table");
    let library = |file: &str, soname: &str, source: String, output: &Path| Job {
        source,
        flags: vec![
            "-shared".into(),
            "-fPIC".into(),
            format!("-Wl,-soname,{soname}"),
        ],
        output: output.join(file),
    };
    let mut jobs = vec![
        library(
            "libcuda.so.1.1",
            "libcuda.so.1",
            cuda.source(version, cuda_driver_version(&params.cuda_version)?),
            &store,
        ),
        library(
            "libdxcore.so",
            "libdxcore.so",
            marker_source("dxcore", "libdxcore.so", version),
            &root.join(LIB_DIR),
        ),
        // Microsoft's Direct3D library beside it, which GPU containers are not given.
        library(
            "libd3d12.so",
            "libd3d12.so",
            marker_source("d3d12", "libd3d12.so", version),
            &root.join(LIB_DIR),
        ),
        library(
            "libigd12umd64.so",
            "libigd12umd64.so",
            marker_source("igd12umd64", "libigd12umd64.so", version),
            &root.join(OTHER_STORE),
        ),
        tools::tool_job(
            &store.join("nvidia-smi"),
            tools::smi_source(version, &params.cuda_version, gpus, |_| "/dev/dxg".into()),
        ),
    ];
    for file in STORE_LIBRARIES {
        let name = file.split(".so").next().unwrap_or(file);
        let symbol = name.trim_start_matches("lib").replace('-', "_");
        jobs.push(library(
            file,
            file,
            marker_source(&symbol, file, version),
            &store,
        ));
    }
    compile::run_all(toolchain, jobs)?;
    for name in STORE_DATA {
        put(
            &store.join(name),
            &format!("NVHOOK-SIM {name} (WSL driver {version})\n"),
        )?;
    }
    fs::copy(mock_nvml, store.join("libnvidia-ml.so.1")).with_context(|| {
        format!(
            "cannot copy the mock NVML from {}: build it with `cargo build -p mock-nvml` or pass --mock-nvml",
            mock_nvml.display()
        )
    })?;
    put(
        &store.join(topology::FILE_NAME),
        &topology::render(params, gpus, dir, 0)?,
    )?;
    loader_cache(&root, toolchain)?;

    let dxg = dir.join("dev/dxg");
    fs::create_dir_all(dir.join("dev")).context("cannot create the node's dev")?;
    let minor = free_misc_minor()?;
    simmig::mknod(&dxg, MISC_MAJOR, minor, 0o666).with_context(|| {
        format!(
            "mknod {} c {MISC_MAJOR} {minor} (simnode must run as root)",
            dxg.display()
        )
    })?;
    let proc_root = dir.join("proc");
    put(
        &proc_root.join("devices"),
        "Character devices:\n  1 mem\n  4 tty\n  5 /dev/tty\n 10 misc\n136 pts\n\nBlock devices:\n  7 loop\n",
    )?;
    put(&proc_root.join("sys/kernel/osrelease"), KERNEL_RELEASE)?;
    fs::create_dir_all(dir.join("sys")).context("cannot create the node's sys")
}

/// The loader cache a WSL2 distribution has: its `ld.so.conf.d/ld.wsl.conf` names Microsoft's
/// library directory.
fn loader_cache(root: &Path, toolchain: &Toolchain) -> Result<()> {
    put(&root.join("etc/ld.so.conf"), &format!("/{LIB_DIR}\n"))?;
    crate::driver::run_ldconfig(root, toolchain)?;
    Ok(())
}

/// The first dynamic misc minor, from [`DYNAMIC_MINOR_TOP`] down, that this host's
/// `/proc/misc` does not list.
fn free_misc_minor() -> Result<u32> {
    let text = fs::read_to_string("/proc/misc").context("cannot read /proc/misc")?;
    let used: Vec<u32> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    (1..=DYNAMIC_MINOR_TOP)
        .rev()
        .find(|m| !used.contains(m))
        .context("every dynamic misc minor is taken on this host: no free number for /dev/dxg")
}
