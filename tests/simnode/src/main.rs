//! simnode: builds a simulated NVIDIA GPU node (driver files, device nodes,
//! /proc files, mock NVML) in a directory, for testing nvhook without a GPU.

mod compile;
mod devices;
mod driver;
mod fabric;
mod libs;
mod machine;
mod node;
mod old_kernel;
mod procfs;
mod spec;
mod sysfs;
mod tools;
mod topology;
mod wsl;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(about = "Build or remove a simulated NVIDIA GPU node (run as root)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a node in DIR, replacing an earlier node there.
    Create(Box<CreateArgs>),
    /// Remove a node that simnode built (refuses any other directory).
    Destroy { dir: PathBuf },
    /// Run COMMAND as on a kernel before Linux 6.15: `open_tree_attr` fails with ENOSYS for
    /// it and every program it starts.
    OldKernel {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
}

#[derive(clap::Args)]
struct CreateArgs {
    dir: PathBuf,
    /// Number of GPUs (0 to 64).
    #[arg(long, default_value_t = 4)]
    gpus: u32,
    /// GPU:COUNT: turn MIG on for GPU and give it COUNT (0 to 7) MIG devices.
    #[arg(long, value_name = "GPU:COUNT", value_parser = parse_mig)]
    mig: Vec<(u32, u32)>,
    #[arg(long, default_value = "550.54.15")]
    driver_version: String,
    #[arg(long, default_value = "12.4")]
    cuda_version: String,
    /// nvmlReturn_t that the mock's nvmlInit returns (0 = success).
    #[arg(long, default_value_t = 0)]
    nvml_init_error: u32,
    /// How long the mock's nvmlInit sleeps, in milliseconds.
    #[arg(long, default_value_t = 0)]
    nvml_init_delay_ms: u64,
    /// The mock NVML library [default: libmock_nvml.so beside simnode].
    #[arg(long)]
    mock_nvml: Option<PathBuf>,
    /// nvhook's path for the node's config.toml [default: nvhook beside simnode].
    #[arg(long)]
    hook_path: Option<PathBuf>,
    /// The GPU in this place on the board (0..gpus) fell off the bus: NVML and the kernel
    /// no longer list it, and the GPUs after it move up an index.
    #[arg(long, value_name = "GPU")]
    lost_gpu: Vec<u32>,
    /// GPU (NVML index) whose persistence mode is off (every GPU has it on otherwise).
    #[arg(long, value_name = "GPU")]
    persistence_off: Vec<u32>,
    /// Change the node in place, as a driver upgrade, a MIG reconfiguration, a lost GPU or a
    /// module reload changes a live host: nvhook's config, log, NVML cache and /dev/char stay.
    #[arg(long)]
    keep_state: bool,
    /// With --keep-state: the kernel module was reloaded, and its dynamic majors
    /// (nvidia-uvm, nvidia-caps) changed.
    #[arg(long, requires = "keep_state")]
    reload_module: bool,
    /// The nvidia-drm module is loaded: each GPU has /dev/dri/card<minor> and
    /// /dev/dri/renderD<128+minor>, listed under its PCI device in the node's sysfs.
    #[arg(long)]
    drm: bool,
    /// The kernel's custom firmware directory (firmware_class.path), absolute: the GSP
    /// firmware goes under DIR/nvidia/<version> in the driver root instead of /lib/firmware.
    #[arg(long, value_name = "DIR")]
    firmware_path: Option<String>,
    /// The CPU architecture of the driver's libraries and tools (and of the --mock-nvml file).
    #[arg(long, value_enum, default_value = "x86_64")]
    arch: machine::Arch,
    /// For --arch aarch64: the Debian sid root of scripts/arm64-toolchain.sh, whose aarch64
    /// gcc and ldconfig build the driver.
    #[arg(long, value_name = "DIR")]
    cross_root: Option<PathBuf>,
    /// The directory of the driver's 64-bit libraries under the driver root, where not Debian's
    /// multiarch one: `usr/local/nvidia/lib64`, as GKE installs the driver. The node then has
    /// no compat32 libraries.
    #[arg(long, value_name = "DIR")]
    lib_dir: Option<String>,
    /// Libraries other than the driver's in the driver root's loader cache, as a real host's
    /// lists every library of the system (a thousand or more with CUDA and a desktop's
    /// installed); their files are not made.
    #[arg(long, default_value_t = 0)]
    other_libraries: usize,
    /// IMEX channels /dev/nvidia-caps-imex-channels/channel0..N.
    #[arg(long, default_value_t = 0)]
    imex_channels: u32,
    /// NVSwitches: /dev/nvidia-nvswitch0..N, nvidia-nvswitchctl and nvidia-nvlink.
    #[arg(long, default_value_t = 0)]
    nvswitch: u32,
    /// GPUDirect Storage: /dev/nvidia-fs0..3.
    #[arg(long)]
    gds: bool,
    /// An RDMA adapter: /dev/infiniband/uverbs0, umad0 and rdma_cm.
    #[arg(long)]
    mofed: bool,
    /// GDRCopy: /dev/gdrdrv.
    #[arg(long)]
    gdrcopy: bool,
    /// The driver is from before CUDA 13.4: its NVML exports no nvmlDeviceSetMemoryLimits_v1
    /// or nvmlDeviceGetMemoryLimits_v1 (the mock built without them,
    /// libmock_nvml_no_memory_limits.so beside simnode, unless --mock-nvml names another).
    #[arg(long, conflicts_with = "memory_limits_not_supported")]
    no_memory_limits: bool,
    /// The driver has the memory limit calls, and they answer NOT_SUPPORTED.
    #[arg(long)]
    memory_limits_not_supported: bool,
    /// A WSL2 guest: /dev/dxg, libdxcore.so and NVIDIA's driver store under /usr/lib/wsl, an
    /// NVML without minor numbers; no NVIDIA kernel module, /dev/nvidia* or /proc/driver/nvidia.
    #[arg(long, conflicts_with_all = [
        "mig", "drm", "firmware_path", "imex_channels", "nvswitch", "gds", "mofed", "gdrcopy",
        "keep_state", "lost_gpu", "other_libraries",
    ])]
    wsl: bool,
}

fn parse_mig(text: &str) -> Result<(u32, u32), String> {
    let (gpu, count) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: expected GPU:COUNT, e.g. 1:2"))?;
    let number = |s: &str| {
        s.parse::<u32>()
            .map_err(|_| format!("{text:?}: {s:?} is not a number"))
    };
    Ok((number(gpu)?, number(count)?))
}

fn main() {
    if let Err(err) = run(Cli::parse()) {
        eprintln!("simnode: {err:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("must run as root: device nodes are made with mknod (try sudo)");
    }
    match cli.command {
        Command::Create(args) => create(*args),
        Command::Destroy { dir } => node::destroy(&dir),
        Command::OldKernel { command } => old_kernel::run(&command),
    }
}

fn create(args: CreateArgs) -> Result<()> {
    let params = spec::Params {
        gpus: args.gpus,
        mig: args.mig,
        driver_version: args.driver_version,
        cuda_version: args.cuda_version,
        nvml_init_error: args.nvml_init_error,
        nvml_init_delay_ms: args.nvml_init_delay_ms,
        lost: args.lost_gpu,
        fabric: fabric::Fabric {
            imex_channels: args.imex_channels,
            nvswitches: args.nvswitch,
            gds: args.gds,
            mofed: args.mofed,
            gdrcopy: args.gdrcopy,
        },
        persistence_off: args.persistence_off,
        memory_limits_not_supported: args.memory_limits_not_supported,
        wsl: args.wsl,
    };
    let default_mock = match args.no_memory_limits {
        true => "libmock_nvml_no_memory_limits.so",
        false => "libmock_nvml.so",
    };
    let mock_nvml = absolute(
        args.mock_nvml
            .map_or_else(|| beside_self(default_mock), Ok)?,
    )?;
    let hook_path = absolute(args.hook_path.map_or_else(|| beside_self("nvhook"), Ok)?)?;
    let toolchain = machine::Toolchain::new(args.arch, args.cross_root, args.lib_dir)?;
    let inputs = node::Inputs {
        toolchain: &toolchain,
        params: &params,
        mock_nvml: &mock_nvml,
        hook_path: &hook_path,
        keep_state: args.keep_state.then_some(node::KeepState {
            new_majors: args.reload_module,
        }),
        display: node::Display {
            drm: args.drm,
            firmware_path: args.firmware_path,
        },
        other_libraries: args.other_libraries,
    };
    node::create(&args.dir, &inputs)
}

fn beside_self(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the simnode executable")?;
    Ok(exe.parent().unwrap_or(Path::new("/")).join(name))
}

fn absolute(path: PathBuf) -> Result<PathBuf> {
    std::path::absolute(&path).with_context(|| format!("cannot make {} absolute", path.display()))
}
