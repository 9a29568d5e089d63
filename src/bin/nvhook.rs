//! `nvhook`: inventory, plan and the OCI hook, as thin front ends over the library.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use nvhook::config::Config;
use nvhook::configure::{DEFAULT_RUNTIME_NAME, DEFAULT_RUNTIME_PATH, Engine};
use nvhook::inventory::Inventory;
use nvhook::oci::{Spec, State};
use nvhook::plan::Plan;
use nvhook::request::{Decision, Request};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser)]
#[command(name = "nvhook", version, about = "Give OCI containers NVIDIA GPUs")]
struct Cli {
    /// Config file (default: $NVHOOK_CONFIG, else /etc/nvhook/config.toml).
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
    },
    /// Register nvhook-runtime with a container engine's config (or take it out with --remove).
    Configure(ConfigureArgs),
}

#[derive(clap::Args)]
struct ConfigureArgs {
    /// docker, containerd or crio.
    engine: Engine,
    /// The engine's config file [default: /etc/docker/daemon.json,
    /// /etc/containerd/config.toml, /etc/crio/crio.conf.d/99-nvidia.conf].
    #[arg(long, value_name = "FILE")]
    engine_config: Option<PathBuf>,
    /// The runtime's name: `docker run --runtime=NAME`, a RuntimeClass's handler.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_RUNTIME_NAME)]
    runtime_name: String,
    /// The nvhook-runtime binary the engine runs.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_RUNTIME_PATH)]
    runtime_path: String,
    /// Also make it the engine's default runtime.
    #[arg(long)]
    set_as_default: bool,
    /// Print the change as a diff; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Take out what configure added.
    #[arg(long, conflicts_with = "set_as_default")]
    remove: bool,
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
}

fn main() {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(()) => 0,
        Err(e) => {
            // Our errors carry their cause in their own one-line message.
            eprintln!("nvhook: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<()> {
    if let Command::Hook { stage } = cli.command {
        return hook(cli.config.as_deref(), stage);
    }
    if let Command::Configure(args) = cli.command {
        return configure(cli.config.as_deref(), args);
    }
    let env_config = std::env::var(nvhook::config::ENV_VAR).ok();
    let config = Config::load(cli.config.as_deref(), env_config.as_deref())?;
    nvhook::logging::init(&config);
    match cli.command {
        Command::Info { format } => info(&config, format),
        Command::Plan { bundle, format } => plan(&config, &bundle, format),
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

fn hook(config_path: Option<&Path>, stage: Stage) -> Result<()> {
    scrub_process();
    let started = Instant::now();
    // No $NVHOOK_CONFIG here: the hook's environment is not to be trusted.
    let config = Config::load(config_path, None)?;
    nvhook::logging::init(&config);
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
    let outcome = nvhook::inject::prestart(&config, &state).inspect_err(|e| {
        // Without a log file, main's stderr line is the only report; with one, keep it there too.
        if config.log_file.is_some() {
            tracing::error!(id = %state.id, "{e}");
        }
    })?;
    tracing::info!(
        ?stage,
        id = %state.id,
        ?outcome,
        total_us = started.elapsed().as_micros(),
        "hook finished"
    );
    Ok(())
}

fn configure(nvhook_config: Option<&Path>, args: ConfigureArgs) -> Result<()> {
    // The global --config is nvhook's own file; taking it for the engine's would be a guess.
    if let Some(file) = nvhook_config {
        anyhow::bail!(
            "--config {} names nvhook's own config, which configure does not read: \
             name the engine's file with --engine-config",
            file.display()
        );
    }
    let outcome = nvhook::configure::run(&nvhook::configure::Options {
        engine: args.engine,
        file: args.engine_config,
        runtime_name: args.runtime_name,
        runtime_path: args.runtime_path,
        set_as_default: args.set_as_default,
        remove: args.remove,
        dry_run: args.dry_run,
    })?;
    println!("{outcome}");
    Ok(())
}

fn info(config: &Config, format: Format) -> Result<()> {
    let inventory = Inventory::load(config)?;
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&inventory)?),
        Format::Text => print!("{}", nvhook::report::inventory_text(&inventory)),
    }
    Ok(())
}

fn plan(config: &Config, bundle: &Path, format: Format) -> Result<()> {
    let spec = Spec::load(bundle)?;
    let decision = Request::decide(&spec, config)?;
    let plan: Option<Plan> = match &decision {
        Decision::Gpu(request) => {
            let rootfs = spec
                .rootfs(bundle)
                .context("the bundle's config.json has no root.path")?;
            let inventory = Inventory::load(config)?;
            Some(nvhook::inject::plan_for(
                request, &inventory, config, &rootfs,
            )?)
        }
        Decision::NotRequested | Decision::EnvIgnored => None,
    };
    match format {
        Format::Json => {
            let out = serde_json::json!({ "gpu_requested": plan.is_some(), "plan": plan });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Format::Text => match &plan {
            Some(p) => print!("{}", nvhook::report::plan_text(p)),
            None => println!("{}", nvhook::report::no_gpu_text(&decision)),
        },
    }
    Ok(())
}
