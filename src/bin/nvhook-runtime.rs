//! `nvhook-runtime`: configured in engines in place of runc. On `create`/`run` of a GPU
//! container it prepares the bundle, then execs the real runtime with the same arguments.
// std's start-up is skipped: see nvhook::entry.
#![no_main]

use anyhow::Result;
use nvhook::config::{self, Config};
use nvhook::runtime::{Invocation, find_runtime, prepare_bundle};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

#[unsafe(no_mangle)]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    nvhook::entry::run(shim_main)
}

fn shim_main() -> i32 {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let err = match run(&args) {
        Ok(runtime) => std::process::Command::new(&runtime)
            .arg0(&runtime)
            .args(&args)
            .exec()
            .into(),
        Err(e) => e,
    };
    eprintln!("nvhook-runtime: {err}");
    1
}

/// Prepares the bundle when needed and returns the runtime to exec.
fn run(args: &[OsString]) -> Result<PathBuf> {
    let config_path = std::env::var_os(config::ENV_VAR).map(PathBuf::from);
    let config = Config::load(config_path.as_deref(), None)?;
    let runtime = find_runtime(&config, std::env::var_os("PATH").as_deref())?;
    let invocation = Invocation::parse(args);
    if invocation.creates() {
        nvhook::logging::init(&config);
        let bundle = match invocation.bundle {
            Some(b) => b,
            None => std::env::current_dir().map_err(|e| {
                anyhow::anyhow!("cannot find the bundle (no --bundle and no cwd): {e}")
            })?,
        };
        if prepare_bundle(&config, config_path.as_deref(), &bundle)? {
            tracing::info!(bundle = %bundle.display(), runtime = %runtime.display(), "GPU container prepared");
        }
    }
    Ok(runtime)
}
