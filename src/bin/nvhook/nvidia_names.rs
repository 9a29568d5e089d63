//! nvhook run under NVIDIA's command names (a link named so), as engines' `--gpus` run them.
//!
//! The config comes from `$NVHOOK_CONFIG` here, unlike `nvhook hook`: these names are run by
//! engines that give the hook their own environment (dockerd's and ctr's), never the image's,
//! and their command lines have no room for nvhook's `--config`.

use crate::Stage;
use crate::hook::{hook, hook_process, memory_limits, run_hook};
use nvhook::host_plan::{self, Target};
use nvhook::inventory::{Scope, isolated};
use nvhook::logging::Sink;
use nvhook::nvidia_cli::cdi_hook::{self, CdiHook, CdiHookError};
use nvhook::nvidia_cli::runtime_hook::{self, RuntimeHook};
use nvhook::nvidia_cli::{self, CDI_HOOK_NAME, CLI_NAME, Command, Global, RUNTIME_HOOK_NAME};
use nvhook::request::{Flags, Request};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The exit status of running as `name`, or None when `name` is not one of NVIDIA's.
pub fn run(name: &Path, args: &[OsString]) -> Option<i32> {
    let name = name.file_name()?.to_str()?;
    if !nvidia_cli::NAMES.contains(&name) {
        return None;
    }
    let args: Vec<String> = match args.iter().map(|a| a.clone().into_string()).collect() {
        Ok(args) => args,
        Err(arg) => return Some(usage(name, &format!("argument {arg:?} is not UTF-8"))),
    };
    let config = std::env::var_os(nvhook::config::ENV_VAR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let result = match name {
        RUNTIME_HOOK_NAME => match runtime_hook::parse(&args) {
            Ok(RuntimeHook::Prestart) => hook(config.as_deref(), Stage::Prestart, &[]),
            // NVIDIA's hook does nothing at these stages either.
            Ok(RuntimeHook::Nothing) => Ok(()),
            Ok(RuntimeHook::Version) => {
                print!("{}", version_text(name));
                Ok(())
            }
            Ok(RuntimeHook::Help) => {
                eprint!("{}", runtime_hook::USAGE);
                Ok(())
            }
            // Go's flag package: the error, the usage, exit status 2.
            Err(e) => {
                eprintln!("nvhook (as {name}): {e}");
                eprint!("{}", runtime_hook::USAGE);
                return Some(2);
            }
        },
        CLI_NAME => match nvidia_cli::parse(&args) {
            Ok((global, command)) => cli(config.as_deref(), &global, command),
            // libnvidia-container's argp exits 1 on a bad command line.
            Err(e) => {
                eprintln!("nvhook (as {name}): {e}");
                return Some(1);
            }
        },
        // A createContainer hook of NVIDIA's CDI specs: nvhook's own createContainer hook.
        CDI_HOOK_NAME => match cdi_hook::parse(&args) {
            Ok(CdiHook::Links(links)) => {
                run_hook(config.as_deref(), Stage::CreateContainer, Some(*links))
            }
            Ok(CdiHook::MemoryLimits(gpus)) => memory_limits(config.as_deref(), &gpus),
            Ok(CdiHook::Nothing(why)) => hook_process(config.as_deref()).map(|_| {
                tracing::info!("as {CDI_HOOK_NAME}: {why}");
            }),
            // NVIDIA's warning, and success: a spec from a newer toolkit never stops a start.
            Ok(CdiHook::Unsupported(warning)) => {
                if let Ok((_, nvhook::logging::Sink::File)) = hook_process(config.as_deref()) {
                    tracing::warn!("as {CDI_HOOK_NAME}: {warning}: nothing done");
                }
                // NVIDIA's `--quiet` silences its warnings.
                if !args.iter().any(|a| a == "--quiet" || a == "-quiet") {
                    eprintln!("nvhook (as {name}): warning: {warning}: nothing done");
                }
                Ok(())
            }
            Ok(CdiHook::Version) => {
                print!("{}", version_text(name));
                Ok(())
            }
            Ok(CdiHook::Help(hook)) => {
                print!("{}", cdi_hook::help(hook));
                Ok(())
            }
            // NVIDIA's hook fails (exit 1) on a bad flag of a hook it knows, the hook's help on
            // stdout.
            Err(e) => {
                if let CdiHookError::UnknownOption { hook, .. } = &e {
                    print!("{}", cdi_hook::help(Some(hook)));
                }
                Err(e.into())
            }
        },
        _ => unreachable!("one of NAMES"),
    };
    Some(match result {
        Ok(()) => 0,
        Err(e) => {
            // The engine shows this line as the hook's error: say who answered.
            eprintln!("nvhook (as {name}): {e}");
            1
        }
    })
}

/// `--root=PATH` names the driver root, which nvhook takes from its config: a different one
/// would be a node set up for another driver than nvhook's config serves.
fn check_root(config: &nvhook::config::Config, global: &Global) -> anyhow::Result<()> {
    match &global.root {
        Some(root) if Path::new(root) != config.driver_root => anyhow::bail!(
            "--root={root}: nvhook's config names driver root {} (set driver-root in it, or leave --root out)",
            config.driver_root.display()
        ),
        _ => Ok(()),
    }
}

/// The NVIDIA release whose programs nvhook answers as, for version probes.
const NVIDIA_RELEASE: &str = "1.20.0";

/// What `--version` prints under `name`: NVIDIA's shape, the release nvhook answers as, and
/// nvhook's own version where NVIDIA's names its commit.
fn version_text(name: &str) -> String {
    let nvhook = env!("CARGO_PKG_VERSION");
    match name {
        CDI_HOOK_NAME => {
            format!("NVIDIA CDI Hook version {NVIDIA_RELEASE}\ncommit: nvhook {nvhook}\n")
        }
        RUNTIME_HOOK_NAME => format!(
            "NVIDIA Container Runtime Hook version {NVIDIA_RELEASE}\ncommit: nvhook {nvhook}\n"
        ),
        // libnvidia-container's seven lines.
        _ => format!(
            "cli-version: {NVIDIA_RELEASE}\nlib-version: {NVIDIA_RELEASE}\nbuild date: -\nbuild revision: nvhook {nvhook}\nbuild compiler: rustc\nbuild platform: {}\nbuild flags: -\n",
            std::env::consts::ARCH
        ),
    }
}

fn usage(name: &str, message: &str) -> i32 {
    eprintln!("nvhook (as {name}): {message}");
    2
}

fn cli(config_path: Option<&Path>, global: &Global, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Version => {
            print!("{}", version_text(CLI_NAME));
            return Ok(());
        }
        Command::Help(command) => {
            print!("{}", nvidia_cli::help(command));
            return Ok(());
        }
        _ => {}
    }
    if let Command::Configure(configure) = command {
        let (mut config, sink) = hook_process(config_path)?;
        check_root(&config, global)?;
        if configure.no_cuda_compat {
            config.cuda_compat = nvhook::config::CudaCompatMode::Off;
        }
        let request = Request::from_flags(&configure.flags, &config)?;
        let outcome = nvhook::hook::configure_process(
            &config,
            &request,
            configure.pid,
            configure.rootfs,
            !configure.no_cgroups,
        )
        .inspect_err(|e| {
            if sink == Sink::File {
                tracing::error!(pid = configure.pid, "{e}");
            }
        })?;
        tracing::info!(pid = configure.pid, ?outcome, "configured as {CLI_NAME}");
        return Ok(());
    }
    let config = nvhook::config::load(config_path, None)?;
    nvhook::logging::init(&config);
    check_root(&config, global)?;
    // NVML's cached answer serves while the host is as it was.
    let (inventory, source) = isolated::load(&config, Scope::ALL)?;
    print!(
        "{}",
        match command {
            Command::Info { csv } => nvidia_cli::info::info_text(&inventory, csv),
            Command::List(list) => {
                // The nodes of `--device`'s GPUs are those configure would give them: the
                // same request and plan, so an unknown device gets the same one line.
                let selected = if list.devices == Flags::default() {
                    Vec::new()
                } else {
                    let request = Request::from_flags(&list.devices, &config)?;
                    let target = Target::AnyImage;
                    host_plan::plan_for_host(&request, inventory.clone(), source, &config, target)?
                        .devices
                };
                nvidia_cli::info::list_text(&inventory, &list, &selected)
            }
            Command::Configure(_) | Command::Version | Command::Help(_) => {
                unreachable!("handled above")
            }
        }
    );
    Ok(())
}
