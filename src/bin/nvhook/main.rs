//! `nvhook`: inventory, plan and the OCI hook, as thin front ends over the library.
// std's start-up is skipped: see nvhook::entry. The test build keeps the harness's main and
// tests the command-line readers only, so the rest is unused there.
#![cfg_attr(not(test), no_main)]
#![cfg_attr(test, allow(dead_code))]

mod cdi;
mod configure;
mod describe;
mod doctor;
mod hook;
mod hook_line;
mod nri;
mod nvidia_names;
mod runtime;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use nvhook::configure::{ConfigureError, DEFAULT_RUNTIME_NAME, Engine};
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(name = "nvhook", version, about = "Give OCI containers NVIDIA GPUs")]
struct Cli {
    /// nvhook's config file [default: $NVHOOK_CONFIG, else /etc/nvhook/config.toml];
    /// configure takes it only with --kubernetes, which sets the policy there.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the GPUs and driver files of this host.
    Info {
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Print what nvhook would do for a bundle's config.json; changes nothing.
    Plan {
        #[arg(long, value_name = "DIR")]
        bundle: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Run as an OCI hook (the runtime passes the container state on stdin).
    Hook {
        #[arg(value_enum)]
        stage: Stage,
        /// createContainer: what to link and cache, as a CDI spec's hook entry says;
        /// memoryLimits: the GPUs' UUIDs.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Container Device Interface specs for engines that inject devices themselves.
    #[command(subcommand)]
    Cdi(CdiCommand),
    /// Make the `/dev/char/MAJ:MIN` links of every NVIDIA device node (run at boot and by udev),
    /// so systemd can keep containers' GPU rules across `systemctl daemon-reload`.
    DevCharLinks,
    /// Register nvhook-runtime with a container engine's config (or take it out with --remove).
    Configure(ConfigureArgs),
    /// Check that this node is ready to give containers GPUs: one line per check, with the
    /// fix for each problem; exit status 0 when ready, 1 when a check failed.
    Doctor {
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Read engine configs, hooks.d and CDI spec directories under this directory.
        #[arg(long, value_name = "DIR", default_value = "/")]
        root: PathBuf,
        /// The runtime name the engines should have (`docker run --runtime=NAME`).
        #[arg(long, value_name = "NAME", default_value = DEFAULT_RUNTIME_NAME)]
        runtime_name: String,
        /// The nvhook-runtime the engines should run [default: the one beside this nvhook].
        #[arg(long, value_name = "PATH")]
        runtime_path: Option<String>,
        /// This node gives GPUs through `nvhook nri`, started by something doctor cannot see
        /// set up (the Kubernetes installer's NRI mode): check NRI as for a set-up plugin.
        #[arg(long)]
        nri: bool,
    },
    /// Run as an NRI plugin of containerd 2.x or CRI-O until stopped: GPU containers get
    /// their devices from the engine itself, with no engine config and no RuntimeClass.
    /// Started by the engine from its plugin directory (as NN-nvhook), it needs no arguments.
    Nri {
        /// The engine's NRI socket.
        #[arg(long, value_name = "PATH", default_value = nvhook_nri::DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Where nvhook runs among the engine's plugins (two digits, lowest first).
        #[arg(long, value_name = "NN", default_value = nvhook::nri::PLUGIN_INDEX)]
        index: String,
    },
    /// Prepare nvhook-runtime's GPU creates in this process until stopped, so that a GPU
    /// create starts no second program: nvhook-runtime asks it at the config's
    /// `runtime-server` socket, and runs `nvhook runtime` itself where none answers.
    RuntimeServer {
        /// The socket to listen on [default: the config's runtime-server].
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
    },
    /// Run nvhook's Kubernetes DRA kubelet plugin, `nvhook-dra` (installed beside nvhook), with
    /// ARGS: `nvhook dra --help` lists them. nvhook's `--config` is passed on.
    #[command(disable_help_flag = true)]
    Dra {
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGS"
        )]
        args: Vec<std::ffi::OsString>,
    },
    /// Print Kubernetes node labels for this node's GPUs, named as GPU feature discovery
    /// names them (nvidia.com/gpu.product, nvidia.com/gpu.count, ...).
    Labels {
        /// text (`name=value` lines), json, or nfd (a Node Feature Discovery feature file).
        #[arg(long, value_enum, default_value_t = LabelFormat::Text)]
        format: LabelFormat,
        /// The labels' namespace.
        #[arg(long, value_name = "DOMAIN", default_value = nvhook::labels::DEFAULT_PREFIX)]
        prefix: String,
        /// The device plugin's MIG strategy: none (full GPUs), single (every GPU split alike:
        /// gpu.count counts MIG devices), mixed (mig-<profile>.count for each profile).
        #[arg(long, value_enum, default_value_t = MigStrategy::None)]
        mig_strategy: MigStrategy,
        /// Replace this file with them, atomically (e.g.
        /// /etc/kubernetes/node-feature-discovery/features.d/nvhook) [default: stdout].
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum MigStrategy {
    None,
    Single,
    Mixed,
}

impl From<MigStrategy> for nvhook::labels::MigStrategy {
    fn from(strategy: MigStrategy) -> Self {
        match strategy {
            MigStrategy::None => Self::None,
            MigStrategy::Single => Self::Single,
            MigStrategy::Mixed => Self::Mixed,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum LabelFormat {
    Text,
    Json,
    Nfd,
}

#[derive(clap::Args)]
struct ConfigureArgs {
    /// docker, containerd, crio, k3s or rke2.
    engine: Engine,
    /// The engine's config file [default: /etc/docker/daemon.json,
    /// /etc/containerd/config.toml, /etc/crio/crio.conf.d/99-nvidia.conf; for k3s and RKE2,
    /// the containerd template under /var/lib/rancher/{k3s,rke2}/agent/etc/containerd]. For
    /// containerd 2, the main config: the runtime goes into the drop-in directory it imports.
    #[arg(long, value_name = "FILE")]
    engine_config: Option<PathBuf>,
    /// The runtime's name: `docker run --runtime=NAME`, a RuntimeClass's handler.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_RUNTIME_NAME)]
    runtime_name: String,
    /// The nvhook-runtime binary the engine runs [default: the one beside this nvhook].
    #[arg(long, value_name = "PATH")]
    runtime_path: Option<String>,
    /// Write --runtime-path even where no file is there yet (an image that installs it later).
    #[arg(long)]
    allow_missing: bool,
    /// Also make it the engine's default runtime.
    #[arg(long)]
    set_as_default: bool,
    /// Print the change as a diff; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Take out what configure added.
    #[arg(long, conflicts_with = "set_as_default")]
    remove: bool,
    /// Kubernetes node: also set the hardened device-selection policy in nvhook's config
    /// (accept-env-when-unprivileged = false, accept-volume-mount-devices = true), so that a
    /// pod gets only the GPUs the device plugin allocated to it.
    #[arg(long)]
    kubernetes: bool,
    /// NRI plugin mode (containerd, crio): instead of a runtime, turn the engine's NRI on where
    /// its config leaves it off (containerd 1.7; containerd 2 runs it by default), for
    /// `nvhook nri` (nvhook-nri.service). With --remove: give back what that changed.
    #[arg(long, conflicts_with_all = ["set_as_default", "runtime_name", "runtime_path", "allow_missing"])]
    nri: bool,
}

#[derive(Subcommand)]
enum CdiCommand {
    /// Write a CDI spec (kind nvidia.com/gpu) for this node's GPUs and MIG devices, plus `all`.
    Generate {
        /// The spec file, e.g. /etc/cdi/nvidia.yaml [default: stdout].
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// yaml or json [default: json for a .json output, else yaml].
        #[arg(long)]
        format: Option<nvhook::cdi::Format>,
        /// How devices are named: index (`0`, `1:0`), uuid, or both.
        #[arg(long, value_delimiter = ',', default_value = "index,uuid")]
        device_name_strategy: Vec<nvhook::cdi::NameStrategy>,
    },
    /// Write the spec again only if this node's GPUs, MIG devices or driver changed since it
    /// was written (a boot, a driver upgrade, a MIG reconfiguration); otherwise leave it be.
    Refresh {
        /// The spec file.
        #[arg(long, value_name = "FILE", default_value = nvhook::cdi::REFRESHED_SPEC)]
        output: PathBuf,
        /// yaml or json [default: json for a .json output, else yaml].
        #[arg(long)]
        format: Option<nvhook::cdi::Format>,
        /// How devices are named: index (`0`, `1:0`), uuid, or both.
        #[arg(long, value_delimiter = ',', default_value = "index,uuid")]
        device_name_strategy: Vec<nvhook::cdi::NameStrategy>,
    },
    /// Print the device names spec files offer [default: the specs in /etc/cdi and /var/run/cdi].
    List {
        #[arg(value_name = "FILE")]
        files: Vec<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum, Debug, PartialEq)]
enum Stage {
    Prestart,
    #[value(name = "createRuntime")]
    CreateRuntime,
    /// In the container's mount namespace: the links and loader cache of a CDI spec.
    #[value(name = "createContainer")]
    CreateContainer,
    /// At createRuntime: the container's GPU memory limits on the GPUs named (UUIDs), for the
    /// paths that give the runtime the rest of the work (a CDI route, NRI).
    #[value(name = "memoryLimits")]
    MemoryLimits,
}

/// For a long-running command: SIGTERM and SIGINT run `stop` on a thread of their own, then
/// end the process with status 0. Call before any other thread starts (they inherit the mask).
fn on_stop_signal(stop: impl FnOnce(nix::sys::signal::Signal) + Send + 'static) -> Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.thread_block()?;
    std::thread::spawn(move || {
        if let Ok(signal) = signals.wait() {
            stop(signal);
            std::process::exit(0);
        }
    });
    Ok(())
}

#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    nvhook::entry::run(nvhook_main)
}

fn nvhook_main() -> i32 {
    // Run under one of NVIDIA's names (a link), the command line is that program's.
    let argv: Vec<_> = std::env::args_os().collect();
    if let Some(status) = argv
        .split_first()
        .and_then(|(name, args)| nvidia_names::run(Path::new(name), args))
    {
        return status;
    }
    let Some((program, args)) = argv.split_first() else {
        return report(run(Cli::parse()));
    };
    // nvhook-runtime's hand-over, before clap: the rest is runc's command line, not ours.
    if let Some((subcommand, rest)) = args.split_first()
        && subcommand == nvhook_runtime::CREATE_SUBCOMMAND
    {
        return runtime::main(program, rest);
    }
    // A container start's hook, before clap too: see hook_line.
    if let Some(line) = hook_line::read(args) {
        return report(hook::hook(line.config.as_deref(), line.stage, &line.args));
    }
    // Started by the engine from its plugin directory: the socket is in the environment and
    // there are no arguments.
    if std::env::var_os(nvhook_nri::SOCKET_ENV).is_some() && std::env::args_os().len() == 1 {
        return report(nri::nri(
            None,
            Path::new(nvhook_nri::DEFAULT_SOCKET),
            nvhook::nri::PLUGIN_INDEX,
        ));
    }
    report(run(Cli::parse()))
}

/// The exit status of a command's result, with its error reported once.
fn report(result: Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            // Our errors carry their cause in their own one-line message.
            eprintln!("nvhook: {e}");
            // Exit 2 like clap's own usage errors: a script can tell a wrong command line
            // from a host that is not ready.
            if is_usage(&e) { 2 } else { 1 }
        }
    }
}

/// A mistake in nvhook's command line that clap cannot see: a combination of flags, or a
/// flag's value that only nvhook can judge.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Usage(String);

fn is_usage(e: &anyhow::Error) -> bool {
    e.is::<Usage>()
        || e.downcast_ref::<ConfigureError>()
            .is_some_and(ConfigureError::is_usage)
        || e.is::<nvhook::labels::PrefixError>()
}

fn run(cli: Cli) -> Result<()> {
    if let Command::Hook { stage, args } = cli.command {
        return hook::hook(cli.config.as_deref(), stage, &args);
    }
    if let Command::Configure(args) = cli.command {
        return configure::configure(cli.config.as_deref(), args);
    }
    if let Command::Nri { socket, index } = &cli.command {
        return nri::nri(cli.config.as_deref(), socket, index);
    }
    if let Command::RuntimeServer { socket } = cli.command {
        return runtime::server(cli.config.as_deref(), socket);
    }
    if let Command::Dra { args } = &cli.command {
        return Err(dra(cli.config.as_deref(), args));
    }
    let env_config = std::env::var(nvhook::config::ENV_VAR).ok();
    let config = nvhook::config::load(cli.config.as_deref(), env_config.as_deref())?;
    nvhook::logging::init(&config);
    match cli.command {
        Command::Info { format } => describe::info(&config, format),
        Command::Plan { bundle, format } => describe::plan(&config, &bundle, format),
        Command::Cdi(command) => {
            // The spec's hook must read the config this run read, however it was named.
            let named = cli
                .config
                .clone()
                .or_else(|| env_config.filter(|v| !v.is_empty()).map(PathBuf::from));
            cdi::cdi(&config, named.as_deref(), command)
        }
        Command::DevCharLinks => cdi::dev_char_links(&config),
        Command::Nri { .. } | Command::Dra { .. } | Command::RuntimeServer { .. } => {
            unreachable!("handled above")
        }
        Command::Doctor {
            format,
            root,
            runtime_name,
            runtime_path,
            nri,
        } => doctor::doctor(
            &config,
            cli.config.as_deref(),
            format,
            doctor::DoctorArgs {
                root,
                runtime_name,
                runtime_path,
                nri,
            },
        ),
        Command::Labels {
            format,
            prefix,
            mig_strategy,
            output,
        } => describe::labels(
            &config,
            format,
            &prefix,
            mig_strategy.into(),
            output.as_deref(),
        ),
        Command::Hook { .. } | Command::Configure(_) => unreachable!("handled above"),
    }
}

/// Execs `nvhook-dra` beside nvhook with `args`; returns only the reason it could not. The
/// plugin is a binary of its own so that the hook does not load its gRPC and Kubernetes client.
fn dra(config: Option<&Path>, args: &[std::ffi::OsString]) -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let program = nvhook::binary_paths::beside_nvhook("nvhook-dra");
    let mut command = std::process::Command::new(&program);
    command.args(args);
    if let Some(config) = config {
        command.env(nvhook::config::ENV_VAR, config);
    }
    let e = command.exec();
    anyhow::anyhow!(
        "cannot run {}: {e} (nvhook-dra is installed beside nvhook: build it with `cargo build -p nvhook-dra-driver`, or use the installer image)",
        program.display()
    )
}
