//! `nvhook`: inventory, plan and the OCI hook, as thin front ends over the library.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use nvhook::config::Config;
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
            tracing::error!("{e:#}");
            eprintln!("nvhook: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<()> {
    if let Command::Hook { stage } = cli.command {
        return hook(cli.config.as_deref(), stage);
    }
    let env_config = std::env::var(nvhook::config::ENV_VAR).ok();
    let config = Config::load(cli.config.as_deref(), env_config.as_deref())?;
    nvhook::logging::init(&config);
    match cli.command {
        Command::Info { format } => info(&config, format),
        Command::Plan { bundle, format } => plan(&config, &bundle, format),
        Command::Hook { .. } => unreachable!("handled above"),
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
    let mut input = String::new();
    std::io::stdin()
        .take(1 << 20)
        .read_to_string(&mut input)
        .context("cannot read the OCI state on stdin")?;
    let state = State::parse(&input)?;
    let outcome = nvhook::inject::prestart(&config, &state)?;
    tracing::info!(
        ?stage,
        id = %state.id,
        ?outcome,
        total_us = started.elapsed().as_micros(),
        "hook finished"
    );
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
