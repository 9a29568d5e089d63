//! `nvhook runtime RUNC-ARGS`: nvhook-runtime's create path, run by nvhook-runtime for `create` and
//! `run` of a container that may ask for a GPU. It prepares the bundle when the container
//! does ask for one, then execs the real runtime with the same arguments.

use anyhow::Result;
use nvhook::config;
use nvhook::hook::step::Step;
use nvhook::runtime_create::server::{Server, ServerError};
use nvhook::runtime_create::{Inventories, find_runtime, prepare_command};
use nvhook_runtime::Invocation;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

/// Runs the create path on runc's arguments; returns only on failure. `program` is argv[0]:
/// nvhook-runtime passes its own on.
pub fn main(program: &OsStr, args: &[OsString]) -> i32 {
    let err = match run(args) {
        Ok(runtime) => {
            nvhook::logging::release_held();
            std::process::Command::new(&runtime)
                .arg0(&runtime)
                .args(args)
                .exec()
                .into()
        }
        Err(e) => e,
    };
    // Engines show this to the user as the runtime's error: name the program they configured,
    // and a user who typed `nvhook runtime` the one they ran.
    let name = match std::path::Path::new(program).file_name() {
        Some(name) if name == "nvhook-runtime" => "nvhook-runtime",
        _ => "nvhook",
    };
    eprintln!("{name}: {err}");
    1
}

/// Prepares the bundle when needed and returns the runtime to exec.
fn run(args: &[OsString]) -> Result<PathBuf> {
    let started = Instant::now();
    let step = Step::start();
    let config_path = std::env::var_os(config::ENV_VAR).map(PathBuf::from);
    let config = nvhook::kept_config::load(config_path.as_deref())?;
    let runtime = find_runtime(&config, std::env::var_os("PATH").as_deref())?;
    let args = args.iter().map(|a| a.as_bytes());
    if Invocation::parse(args.clone()).creates() {
        nvhook::logging::init(&config);
    }
    prepare_command(
        &config,
        config_path.as_deref(),
        &Inventories::Files,
        args,
        step,
        started,
        "nvhook",
    )?;
    Ok(runtime)
}

/// `nvhook runtime-server`: prepares nvhook-runtime's GPU creates until SIGTERM or SIGINT,
/// which removes the socket and waits for the creates being prepared.
pub(crate) fn server(config_path: Option<&Path>, socket: Option<PathBuf>) -> Result<()> {
    let env_config = std::env::var_os(config::ENV_VAR).filter(|v| !v.is_empty());
    let named = config_path
        .map(Path::to_path_buf)
        .or_else(|| env_config.map(PathBuf::from));
    let config = config::load(named.as_deref(), None)?;
    nvhook::logging::init_service(&config);
    let socket = socket
        .or_else(|| config.runtime_server().map(Path::to_path_buf))
        .ok_or(ServerError::Off)?;
    let server = Arc::new(Server::bind(&socket, named.as_deref())?);
    let stopping = Arc::clone(&server);
    crate::on_stop_signal(move |signal| {
        tracing::info!(%signal, "runtime-server stopping");
        stopping.stop(Duration::from_secs(
            nvhook_runtime::server::REPLY_TIMEOUT_S as u64,
        ));
    })?;
    tracing::info!(socket = %socket.display(), "runtime-server listening");
    // A slow NVML query holds one worker: the others go on with creates whose answer is kept.
    let workers = std::thread::available_parallelism().map_or(4, |n| n.get().max(4));
    server.serve(workers)?;
    Ok(())
}
