//! The hook stages (`nvhook hook prestart|createRuntime|createContainer`) and the start of every
//! process that works on a container: a scrubbed environment, the config, the log, and only
//! the capabilities the hook needs.

use crate::{Stage, Usage};
use anyhow::Result;
use nvhook::config::Config;
use nvhook::hook::create_container;
use nvhook::hook::step::Step;
use nvhook::oci::State;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

/// The hook runs as root inside whatever environment the runtime gave it: drop all of it,
/// so nothing from an image's env (LD_PRELOAD, PATH, ...) reaches anything nvhook loads.
pub(crate) fn scrub_process() {
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
pub(crate) fn hook_process(config_path: Option<&Path>) -> Result<(Config, nvhook::logging::Sink)> {
    scrub_process();
    // Not $NVHOOK_CONFIG: only a caller that may trust its environment passes that in.
    let config = nvhook::kept_config::load(config_path)?;
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

pub(crate) fn hook(config_path: Option<&Path>, stage: Stage, args: &[String]) -> Result<()> {
    // Parsed first: a bad spec entry fails before anything is read or touched. A spec written
    // to a file names its arguments' file, which is read here with them.
    // createRuntime with arguments is a CDI spec's hook; without, the prestart hook's work.
    let link_args = |args: &[String]| -> Result<_> {
        let args = nvhook::delivery::args_file::inline(args)?;
        Ok(Some(nvhook::delivery::hook_args::LinkArgs::parse(&args)?))
    };
    let links = match stage {
        Stage::CreateContainer => link_args(args)?,
        Stage::CreateRuntime if !args.is_empty() => link_args(args)?,
        Stage::MemoryLimits => return memory_limits(config_path, args),
        _ if !args.is_empty() => {
            return Err(Usage(format!(
                "{stage:?} takes no arguments (only createRuntime and createContainer do): {args:?}"
            ))
            .into());
        }
        _ => None,
    };
    run_hook(config_path, stage, links)
}

/// The container's GPU memory limits on `gpu_uuids`: nvhook's createRuntime hook where it asks
/// for some, and NVIDIA's (`nvidia-cdi-hook apply-cuda-memory-limits`).
pub(crate) fn memory_limits(config_path: Option<&Path>, gpu_uuids: &[String]) -> Result<()> {
    let (config, sink) = hook_process(config_path)?;
    let state = read_state()?;
    nvhook::hook::memory_limits::create_runtime(&config, &state, gpu_uuids).inspect_err(|e| {
        if sink == nvhook::logging::Sink::File {
            tracing::error!(id = %state.id, "{e}");
        }
    })?;
    Ok(())
}

/// The OCI state the runtime writes on a hook's stdin.
pub(crate) fn read_state() -> Result<State> {
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
    Ok(State::parse(&input)?)
}

/// The hook at `stage`, with the work of a CDI spec's hook in `links`; the OCI state is read
/// from stdin.
pub(crate) fn run_hook(
    config_path: Option<&Path>,
    stage: Stage,
    links: Option<nvhook::delivery::hook_args::LinkArgs>,
) -> Result<()> {
    let started = Instant::now();
    let mut step = Step::start();
    let spec_stage = match stage {
        Stage::CreateRuntime => create_container::Stage::CreateRuntime,
        _ => create_container::Stage::CreateContainer,
    };
    // runc starts a createContainer hook in the container's rootfs; scrubbing leaves it. The
    // other stages have no use for it.
    let cwd = links
        .as_ref()
        .filter(|_| spec_stage == create_container::Stage::CreateContainer)
        .and_then(|_| std::env::current_dir().ok());
    let (config, sink) = hook_process(config_path)?;
    step.done("process");
    let create = match links {
        Some(links) => {
            let before =
                create_container::before_state(&config, &links, spec_stage).inspect_err(|e| {
                    // No container id yet: see log_error below.
                    if sink == nvhook::logging::Sink::File {
                        tracing::error!("{e}");
                    }
                })?;
            step.done("sources");
            Some((links, before))
        }
        None => None,
    };
    // Until the runtime has written the state and closed the pipe: its time, not the hook's.
    let state = read_state()?;
    step.done("state");
    let log_error = |e: &nvhook::hook::HookError| {
        // Without a log file (none set, or one a rootless engine's user may not open),
        // main's stderr line is the only report; with one, keep it there too.
        if sink == nvhook::logging::Sink::File {
            tracing::error!(id = %state.id, "{e}");
        }
    };
    if let Some((links, before)) = create {
        create_container::create_container(&config, &state, &links, before, cwd.as_deref(), step)
            .inspect_err(log_error)?;
        tracing::info!(?stage, id = %state.id, total_us = started.elapsed().as_micros(), "hook finished");
        return Ok(());
    }
    let outcome = nvhook::hook::prestart(&config, &state, step).inspect_err(log_error)?;
    tracing::info!(
        ?stage,
        id = %state.id,
        ?outcome,
        total_us = started.elapsed().as_micros(),
        "hook finished"
    );
    Ok(())
}
