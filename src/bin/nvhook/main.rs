//! `nvhook`: inventory, plan and the OCI hook, as thin front ends over the library.
// std's start-up is skipped: see nvhook::entry.
#![no_main]

mod nvidia_names;
mod shim;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use nvhook::config::Config;
use nvhook::configure::{ConfigureError, DEFAULT_RUNTIME_NAME, Engine, RUNTIME_BINARY};
use nvhook::inventory::Inventory;
use nvhook::oci::{Spec, State};
use nvhook::request::{Decision, Request};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

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
        /// createContainer only: what to link and cache, as a CDI spec's hook entry says.
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

#[derive(Clone, Copy, ValueEnum, Debug)]
enum Stage {
    Prestart,
    #[value(name = "createRuntime")]
    CreateRuntime,
    /// In the container's mount namespace: the links and loader cache of a CDI spec.
    #[value(name = "createContainer")]
    CreateContainer,
}

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
    let mut args = argv.into_iter();
    // nvhook-runtime's hand-over, before clap: the rest is runc's command line, not ours.
    let program = args.next().unwrap_or_default();
    if args
        .next()
        .is_some_and(|a| a == nvhook_runtime::SHIM_SUBCOMMAND)
    {
        return shim::main(&program, &args.collect::<Vec<_>>());
    }
    // Started by the engine from its plugin directory: the socket is in the environment and
    // there are no arguments.
    if std::env::var_os(nvhook_nri::SOCKET_ENV).is_some() && std::env::args_os().len() == 1 {
        return report(nri(
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
        return hook(cli.config.as_deref(), stage, &args);
    }
    if let Command::Configure(args) = cli.command {
        return configure(cli.config.as_deref(), args);
    }
    if let Command::Nri { socket, index } = &cli.command {
        return nri(cli.config.as_deref(), socket, index);
    }
    let env_config = std::env::var(nvhook::config::ENV_VAR).ok();
    let config = Config::load(cli.config.as_deref(), env_config.as_deref())?;
    nvhook::logging::init(&config);
    match cli.command {
        Command::Info { format } => info(&config, format),
        Command::Plan { bundle, format } => plan(&config, &bundle, format),
        Command::Cdi(command) => {
            // The spec's hook must read the config this run read, however it was named.
            let named = cli
                .config
                .clone()
                .or_else(|| env_config.filter(|v| !v.is_empty()).map(PathBuf::from));
            cdi(&config, named.as_deref(), command)
        }
        Command::DevCharLinks => dev_char_links(&config),
        Command::Nri { .. } => unreachable!("handled above"),
        Command::Doctor {
            format,
            root,
            runtime_name,
            runtime_path,
            nri,
        } => doctor(
            &config,
            cli.config.as_deref(),
            format,
            DoctorArgs {
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
        } => labels(
            &config,
            format,
            &prefix,
            mig_strategy.into(),
            output.as_deref(),
        ),
        Command::Hook { .. } | Command::Configure(_) => unreachable!("handled above"),
    }
}

/// The hook runs as root inside whatever environment the runtime gave it: drop all of it,
/// so nothing from an image's env (LD_PRELOAD, PATH, ...) reaches anything nvhook loads.
fn scrub_process() {
    for (key, _) in std::env::vars_os() {
        // SAFETY: single-threaded at this point; nothing else reads the environment.
        unsafe { std::env::remove_var(key) };
    }
    let _ = std::env::set_current_dir("/");
    // Device nodes and files get exactly the modes nvhook asks for.
    // SAFETY: umask has no memory-safety preconditions.
    unsafe { libc::umask(0) };
}

/// The start of every process that works on a container: a scrubbed process, the config,
/// the log, and only the capabilities the hook needs; returns the config and where errors
/// are logged.
fn hook_process(config_path: Option<&Path>) -> Result<(Config, nvhook::logging::Sink)> {
    scrub_process();
    // Not $NVHOOK_CONFIG: only a caller that may trust its environment passes that in.
    let config = Config::load(config_path, None)?;
    let sink = nvhook::logging::init(&config);
    // Defence in depth, before anything of the container is read: a host that will not let
    // the hook drop capabilities still gets its GPU container, with a warning in the log.
    match nvhook::privileges::keep_only_what_the_hook_needs() {
        Ok(()) if tracing::enabled!(tracing::Level::DEBUG) => {
            tracing::debug!(kernel = %nvhook::privileges::status_lines(), "capabilities kept");
        }
        Ok(()) => {}
        Err(e) => tracing::warn!("{e}"),
    }
    Ok((config, sink))
}

fn hook(config_path: Option<&Path>, stage: Stage, args: &[String]) -> Result<()> {
    // Parsed first: a bad spec entry fails before anything is read or touched.
    let links = match stage {
        Stage::CreateContainer => Some(nvhook::cdi::hook::LinkArgs::parse(args)?),
        _ if !args.is_empty() => {
            return Err(Usage(format!(
                "{stage:?} takes no arguments (only createContainer does): {args:?}"
            ))
            .into());
        }
        _ => None,
    };
    run_hook(config_path, stage, links)
}

/// The hook at `stage`, with the createContainer hook's work in `links`; the OCI state is read
/// from stdin.
fn run_hook(
    config_path: Option<&Path>,
    stage: Stage,
    links: Option<nvhook::cdi::hook::LinkArgs>,
) -> Result<()> {
    let started = Instant::now();
    let (config, sink) = hook_process(config_path)?;
    // A state is a few hundred bytes; a runtime never sends more than this.
    const STATE_LIMIT: u64 = 1 << 20;
    let mut input = String::new();
    std::io::stdin()
        .take(STATE_LIMIT + 1)
        .read_to_string(&mut input)
        .map_err(|e| anyhow::anyhow!("cannot read the OCI state on stdin: {e}"))?;
    if input.len() as u64 > STATE_LIMIT {
        anyhow::bail!("the OCI state on stdin is larger than {STATE_LIMIT} bytes");
    }
    let state = State::parse(&input)?;
    let log_error = |e: &nvhook::inject::HookError| {
        // Without a log file (none set, or one a rootless engine's user may not open),
        // main's stderr line is the only report; with one, keep it there too.
        if sink == nvhook::logging::Sink::File {
            tracing::error!(id = %state.id, "{e}");
        }
    };
    if let Some(links) = links {
        nvhook::cdi::hook::create_container(&config, &state, &links).inspect_err(log_error)?;
        tracing::info!(?stage, id = %state.id, total_us = started.elapsed().as_micros(), "hook finished");
        return Ok(());
    }
    let outcome = nvhook::inject::prestart(&config, &state).inspect_err(log_error)?;
    tracing::info!(
        ?stage,
        id = %state.id,
        ?outcome,
        total_us = started.elapsed().as_micros(),
        "hook finished"
    );
    Ok(())
}

fn configure(config: Option<&Path>, args: ConfigureArgs) -> Result<()> {
    // The global --config is nvhook's own file, as everywhere ($NVHOOK_CONFIG, then
    // /etc/nvhook/config.toml): only --kubernetes writes it, and taking it for the engine's
    // would be a guess.
    if let (Some(file), false) = (config, args.kubernetes) {
        return Err(Usage(format!(
            "drop --config {}: configure reads no nvhook config (the engine's file is \
             --engine-config; only --kubernetes writes nvhook's)",
            file.display()
        ))
        .into());
    }
    let nvhook_config = config.map(Path::to_path_buf).unwrap_or_else(|| {
        std::env::var_os(nvhook::config::ENV_VAR)
            .filter(|v| !v.is_empty())
            .map_or_else(
                || PathBuf::from(nvhook::config::DEFAULT_PATH),
                PathBuf::from,
            )
    });
    let outcome = nvhook::configure::run(&nvhook::configure::Options {
        engine: args.engine,
        file: args.engine_config,
        runtime_name: args.runtime_name,
        runtime_path: args.runtime_path.unwrap_or_else(|| {
            nvhook::install::beside_nvhook(RUNTIME_BINARY)
                .display()
                .to_string()
        }),
        allow_missing: args.allow_missing,
        set_as_default: args.set_as_default,
        remove: args.remove,
        dry_run: args.dry_run,
        kubernetes_policy: args.kubernetes.then_some(nvhook_config),
        nri: args.nri,
        // Whether this containerd has NRI at all: its program says (1.6 has none).
        engine_version: (args.nri && args.engine == Engine::Containerd)
            .then(|| nvhook::doctor::program_version("containerd"))
            .flatten(),
    })?;
    println!("{outcome}");
    Ok(())
}

fn cdi(config: &Config, config_path: Option<&Path>, command: CdiCommand) -> Result<()> {
    match command {
        CdiCommand::Generate {
            output,
            format,
            device_name_strategy,
        } => {
            let inventory = Inventory::load(config)?;
            let spec =
                nvhook::cdi::generate(config, config_path, &inventory, &device_name_strategy)?;
            let format = format.unwrap_or(nvhook::cdi::Format::for_path(output.as_deref()));
            let text = spec.to_text(format);
            match output {
                Some(path) => {
                    nvhook::cdi::write_spec(&path, &text)?;
                    println!("wrote {} ({} devices)", path.display(), spec.devices.len());
                    let extra = nvhook::cdi::generate_extra(&inventory)?;
                    report_extra(nvhook::cdi::write_extra_specs(&path, &extra, format)?);
                    link_dev_char(config, &inventory);
                }
                None => print!("{text}"),
            }
        }
        CdiCommand::Refresh {
            output,
            format,
            device_name_strategy,
        } => {
            // NVML's cached answer serves while the host is as it was: a refresh on an
            // unchanged node asks NVML nothing.
            let (inventory, _) =
                nvhook::inventory::isolated::load(config, nvhook::inventory::Scope::ALL)?;
            let spec =
                nvhook::cdi::generate(config, config_path, &inventory, &device_name_strategy)?;
            let format = format.unwrap_or(nvhook::cdi::Format::for_path(Some(&output)));
            link_dev_char(config, &inventory);
            match nvhook::cdi::refresh_spec(&output, &spec.to_text(format))? {
                true => println!(
                    "refreshed {} ({} devices)",
                    output.display(),
                    spec.devices.len()
                ),
                false => println!("unchanged: {}", output.display()),
            }
            let extra = nvhook::cdi::generate_extra(&inventory)?;
            report_extra(nvhook::cdi::write_extra_specs(&output, &extra, format)?);
        }
        CdiCommand::List { files } => nvhook::cdi::list(
            &files,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr(),
        )?,
    }
    Ok(())
}

/// Says which IMEX channel and device family specs were written or retired.
fn report_extra(outcomes: Vec<nvhook::cdi::ExtraOutcome>) {
    use nvhook::cdi::ExtraOutcome;
    for outcome in outcomes {
        match outcome {
            ExtraOutcome::Written(path) => println!("wrote {}", path.display()),
            ExtraOutcome::Unchanged(_) => {}
            ExtraOutcome::Removed(path) => {
                println!("removed {} (no such devices now)", path.display())
            }
        }
    }
}

/// An engine hands a CDI spec's nodes to the runtime as they are: the links must be there.
fn link_dev_char(config: &Config, inventory: &Inventory) {
    let dev = config.dev_path("/dev");
    nvhook::dev_char::ensure_logged(
        &dev,
        &nvhook::dev_char::for_host_nodes(&dev, &inventory.nodes),
    );
}

fn dev_char_links(config: &Config) -> Result<()> {
    use nvhook::dev_char::{self, LinkOutcome};
    let dev = config.dev_path("/dev");
    let nodes = nvhook::inventory::devices::scan_nodes(config)?;
    let links = dev_char::for_host_nodes(&dev, &nodes);
    if links.is_empty() {
        // Not even an empty /dev/char: a host without the driver is left as it was.
        println!(
            "no NVIDIA device nodes in {}: nothing to link (load the driver, nvidia-modprobe, or check dev-root in the nvhook config)",
            dev.display()
        );
        return Ok(());
    }
    let mut failed = 0;
    for (link, result) in links.iter().zip(dev_char::ensure(&dev, &links)?) {
        let path = dev.join("char").join(&link.name);
        match result {
            Ok(LinkOutcome::Present) => {}
            Ok(LinkOutcome::Created) => println!("created {} -> {}", path.display(), link.target),
            Ok(LinkOutcome::Replaced) => println!("replaced {} -> {}", path.display(), link.target),
            Err(e) => {
                eprintln!("nvhook: {e}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        anyhow::bail!(
            "{failed} of {} links in {} could not be made: systemd cannot keep those devices' \
             rules (move the entries named above out of the way and run this again)",
            links.len(),
            dev.join("char").display()
        );
    }
    println!(
        "{} NVIDIA device nodes linked in {}",
        links.len(),
        dev.join("char").display()
    );
    Ok(())
}

/// doctor's own flags.
struct DoctorArgs {
    root: PathBuf,
    runtime_name: String,
    runtime_path: Option<String>,
    nri: bool,
}

fn doctor(
    config: &Config,
    config_file: Option<&Path>,
    format: Format,
    args: DoctorArgs,
) -> Result<()> {
    let DoctorArgs {
        root,
        runtime_name,
        runtime_path,
        nri,
    } = args;
    // Read under a root that is not there, every engine and hooks.d check would say "none".
    if !root.is_dir() {
        return Err(Usage(format!(
            "--root {}: no such directory (name the directory that holds the host's /etc, or leave --root out for /)",
            root.display()
        ))
        .into());
    }
    let runtime_path = match runtime_path {
        Some(path) => path,
        None => nvhook::install::beside_nvhook(RUNTIME_BINARY)
            .display()
            .to_string(),
    };
    let report = nvhook::doctor::run(
        config,
        &nvhook::doctor::Options {
            root,
            runtime_name,
            runtime_path,
            config_file: config_file.map(Path::to_path_buf),
            nri,
        },
    );
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Format::Text => print!("{}", report.to_text()),
    }
    if !report.ready {
        // The report said why, line by line: nothing more for main to print.
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        std::process::exit(1);
    }
    Ok(())
}

fn labels(
    config: &Config,
    format: LabelFormat,
    prefix: &str,
    mig_strategy: nvhook::labels::MigStrategy,
    output: Option<&Path>,
) -> Result<()> {
    // A wrong flag is a usage error whatever the host has.
    nvhook::labels::check_prefix(prefix)?;
    // NVML's cached answer serves while the host is as it was: labelling on a timer asks
    // NVML nothing on an unchanged node.
    let (inventory, _) = nvhook::inventory::isolated::load(config, nvhook::inventory::Scope::ALL)?;
    let machine_type =
        std::fs::read_to_string(config.sys_path(nvhook::labels::MACHINE_TYPE_FILE)).ok();
    let labels = nvhook::labels::Labels::for_system(
        &inventory.system(),
        machine_type.as_deref(),
        prefix,
        mig_strategy,
    )?;
    let text = match format {
        LabelFormat::Text => labels.to_text(),
        LabelFormat::Json => serde_json::to_string_pretty(&labels)? + "\n",
        LabelFormat::Nfd => labels.to_nfd(),
    };
    let Some(path) = output else {
        print!("{text}");
        return Ok(());
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    nvhook::atomic_file::write_atomic(
        path,
        text.as_bytes(),
        nvhook::atomic_file::NewFile::mode(0o644),
    )
    .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

fn info(config: &Config, format: Format) -> Result<()> {
    let inventory = Inventory::load(config)?;
    // The architecture the driver's libraries are built for: on a mixed fleet, the first
    // thing to know about a node's driver.
    let driver_arch = nvhook::elf_machine::driver_arch(&inventory);
    match format {
        Format::Json => {
            #[derive(serde::Serialize)]
            struct Info<'a> {
                #[serde(flatten)]
                inventory: &'a Inventory,
                driver_arch: Option<nvhook::elf_machine::DriverArch>,
            }
            let info = Info {
                inventory: &inventory,
                driver_arch,
            };
            println!("{}", serde_json::to_string_pretty(&info)?)
        }
        Format::Text => print!(
            "{}",
            nvhook::report::inventory_text(&inventory, driver_arch.as_ref())
        ),
    }
    // GPUs without their nodes can be given to no container: a wrong dev-root, or no driver.
    if !inventory.gpus.is_empty() && inventory.nodes.is_empty() {
        anyhow::bail!(
            "{} GPUs but no NVIDIA device node in {}: check dev-root in the nvhook config, or load the driver (nvidia-modprobe)",
            inventory.gpus.len(),
            config.dev_path("/dev").display()
        );
    }
    Ok(())
}

fn plan(config: &Config, bundle: &Path, format: Format) -> Result<()> {
    let spec = Spec::load(bundle)?;
    let decision = Request::decide(&spec, config)?;
    let planned = match &decision {
        Decision::Gpu(request) => {
            let rootfs_path = spec
                .rootfs(bundle)
                .context("the bundle's config.json has no root.path")?;
            let rootfs = nvhook::rootfs::Rootfs::open(&rootfs_path)?;
            let inventory = Inventory::load(config)?;
            let image = nvhook::host_plan::probe(request, config, &rootfs);
            let plan = nvhook::host_plan::plan_for(
                request,
                &inventory,
                config,
                nvhook::host_plan::Target::Image(&image),
            )?;
            let shadow = nvhook::plan::shadow::shadowing_libcuda(
                &plan,
                spec.env("LD_LIBRARY_PATH"),
                |path| rootfs.resolve(path).is_some(),
            );
            Some((plan, shadow))
        }
        Decision::NotRequested | Decision::EnvIgnored => None,
    };
    match format {
        Format::Json => {
            let (plan, shadow) = planned.unzip();
            let mut out = serde_json::json!({ "gpu_requested": plan.is_some(), "plan": plan });
            // Only when there is one: the document stays as it was for every other image.
            if let Some(shadow) = shadow.flatten() {
                out["shadowing_libcuda"] = serde_json::to_value(shadow)?;
            }
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Format::Text => match &planned {
            Some((plan, shadow)) => {
                print!("{}", nvhook::report::plan_text(plan));
                if let Some(shadow) = shadow {
                    println!("Warning: {shadow}");
                }
            }
            None => println!("{}", nvhook::report::no_gpu_text(&decision)),
        },
    }
    Ok(())
}

/// `nvhook nri`: serves the engine until stopped, connecting again whenever it restarts.
fn nri(config_path: Option<&Path>, socket: &Path, index: &str) -> Result<()> {
    let env_config = std::env::var(nvhook::config::ENV_VAR).ok();
    let named = config_path.map(Path::to_path_buf).or_else(|| {
        env_config
            .as_deref()
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    let stub = nvhook_nri::Stub::from_env(nvhook::nri::PLUGIN_NAME, index, socket)
        .map_err(|e| Usage(e.to_string()))?;
    let config = Config::load(named.as_deref(), None)?;
    nvhook::logging::init_service(&config);
    tracing::info!(plugin = %stub.qualified_name(), endpoint = ?stub.endpoint(), "NRI plugin starting");
    let mut plugin = nvhook::nri::GpuPlugin::new(named);
    // Run by hand or by a unit, the plugin says on stderr (the journal) when it is attached
    // and when it cannot be; without a log file the log is stderr already.
    let to_stderr = config.log_file.is_some();
    let name = stub.qualified_name();
    let endpoint = match stub.endpoint() {
        nvhook_nri::Endpoint::Socket(path) => path.display().to_string(),
        nvhook_nri::Endpoint::Inherited(_) => "the socket the engine gave it".into(),
    };
    let registered_at = match stub.endpoint() {
        nvhook_nri::Endpoint::Socket(path) => path.display().to_string(),
        nvhook_nri::Endpoint::Inherited(_) => {
            nvhook::nri::registration::ENGINE_CONNECTION.to_string()
        }
    };
    stub.run_reporting(&mut plugin, &mut |event| {
        // Doctor reads where this plugin is registered, while it is.
        match event {
            nvhook_nri::Event::Configured => nvhook::nri::registration::registered(&registered_at),
            _ => nvhook::nri::registration::ended(),
        }
        if !to_stderr {
            return;
        }
        match event {
            nvhook_nri::Event::Configured => {
                eprintln!("nvhook nri: registered with the engine at {endpoint} as {name}");
            }
            nvhook_nri::Event::Closed(_) => {
                eprintln!(
                    "nvhook nri: the engine at {endpoint} closed the connection; connecting again"
                );
            }
            nvhook_nri::Event::Failed(e) => {
                eprintln!("nvhook nri: {e}; trying again until it answers");
            }
        }
    })?;
    Ok(())
}
