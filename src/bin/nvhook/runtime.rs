//! `nvhook runtime RUNC-ARGS`: nvhook-runtime's create path, run by nvhook-runtime for `create` and
//! `run` of a container that may ask for a GPU. It prepares the bundle when the container
//! does ask for one, then execs the real runtime with the same arguments.

use anyhow::Result;
use nvhook::config;
use nvhook::hook::step::Step;
use nvhook::runtime_create::{find_runtime, prepare_bundle};
use nvhook_runtime::Invocation;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
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
    let mut step = Step::start();
    let config_path = std::env::var_os(config::ENV_VAR).map(PathBuf::from);
    let config = nvhook::kept_config::load(config_path.as_deref())?;
    let runtime = find_runtime(&config, std::env::var_os("PATH").as_deref())?;
    let invocation = Invocation::parse(args.iter().map(|a| a.as_bytes()));
    if invocation.creates() {
        nvhook::logging::init(&config);
        let bundle = match invocation.bundle {
            Some(b) => PathBuf::from(OsStr::from_bytes(b)),
            None => std::env::current_dir().map_err(|e| {
                anyhow::anyhow!("cannot find the bundle (no --bundle and no cwd): {e}")
            })?,
        };
        step.done("config");
        let prepared = prepare_bundle(&config, config_path.as_deref(), &bundle, &mut step);
        // Logged in its own line, never as a hook's steps, and only for a GPU container.
        let steps = step.finish();
        if prepared? {
            // Its own time until it execs the runtime, as the hooks' `total_us`, and its steps.
            tracing::info!(
                bundle = %bundle.display(),
                runtime = %runtime.display(),
                total_us = started.elapsed().as_micros(),
                "GPU container prepared; steps:{steps}"
            );
        }
    }
    Ok(runtime)
}
