//! `nvhook-nvml LIBRARY`: NVML's view of the GPUs, for nvhook, which runs it with no
//! environment and reads the answer (JSON, [`nvhook_model::inventory::Reply`]) on its stdout.
//!
//! `nvhook-nvml LIBRARY create-mig GPU_UUID GI_PROFILE_ID PLACEMENT_START` and
//! `nvhook-nvml LIBRARY destroy-mig MIG_UUID` make and remove a MIG device, answering
//! [`nvhook_model::inventory::CreateMigReply`] and [`nvhook_model::inventory::DestroyMigReply`].
//!
//! nvhook is a static program, which spares every container start the dynamic loader's work,
//! and a static program cannot load libnvidia-ml. This one is dynamic and does only that; it
//! is the only program of the project that links nvml-wrapper.

mod mig;
mod query;

use nvhook_model::inventory::{CreateMigReply, DestroyMigReply, MigActionFailure};
use std::ffi::OsString;
use std::io::Write;
use std::path::Path;

const USAGE: &str = "usage: nvhook-nvml LIBRARY [create-mig GPU_UUID GI_PROFILE_ID PLACEMENT_START | destroy-mig MIG_UUID] (nvhook runs it to ask NVML about the GPUs and to make MIG devices)";

fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let texts: Option<Vec<&str>> = args.iter().skip(1).map(|a| a.to_str()).collect();
    match (args.first(), texts.as_deref()) {
        (Some(library), Some([])) => answer(Path::new(library)),
        (Some(library), Some(["create-mig", gpu, profile, start])) => {
            let (Ok(profile), Ok(start)) = (profile.parse(), start.parse()) else {
                usage()
            };
            let reply: CreateMigReply = with_nvml(Path::new(library), |nvml| {
                mig::create(nvml, gpu, profile, start)
            });
            reply_and_exit(&reply, reply.is_ok())
        }
        (Some(library), Some(["destroy-mig", mig_uuid])) => {
            let reply: DestroyMigReply =
                with_nvml(Path::new(library), |nvml| mig::destroy(nvml, mig_uuid));
            reply_and_exit(&reply, reply.is_ok())
        }
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!("{USAGE}");
    std::process::exit(2)
}

/// `action` on NVML loaded from `library`; a library that cannot be loaded fails it.
fn with_nvml<T>(
    library: &Path,
    action: impl FnOnce(&nvml_wrapper::Nvml) -> Result<T, MigActionFailure>,
) -> Result<T, MigActionFailure> {
    let nvml = query::init(library).map_err(|e| MigActionFailure {
        code: None,
        message: e.to_string(),
    })?;
    action(&nvml)
}

fn reply_and_exit<T: serde::Serialize>(reply: &T, ok: bool) -> ! {
    let mut out = std::io::stdout().lock();
    let written = serde_json::to_vec(reply)
        .is_ok_and(|bytes| out.write_all(&bytes).and_then(|()| out.flush()).is_ok());
    std::process::exit(i32::from(!(written && ok)))
}

/// Queries NVML from `library`, writes the answer on stdout, closes the standard descriptors
/// and leaves without shutting NVML down: the driver's clean-up is time the container start
/// need not wait for.
fn answer(library: &Path) -> ! {
    // Kept alive to the end: _exit runs no destructor, so NVML is never shut down.
    let queried = query::query(library);
    let reply: Result<&nvhook_model::inventory::System, String> = queried
        .as_ref()
        .map(|(system, _)| system)
        .map_err(|e| e.to_string());
    let mut out = std::io::stdout().lock();
    let written = serde_json::to_vec(&reply)
        .is_ok_and(|bytes| out.write_all(&bytes).and_then(|()| out.flush()).is_ok());
    // Closing stdio now too means that a runtime collecting the hook's output does not wait
    // for the driver's clean-up either.
    for fd in 0..=2 {
        // SAFETY: nothing in this process writes to these descriptors again.
        unsafe { libc::close(fd) };
    }
    // SAFETY: _exit skips destructors; NVML's handle is deliberately leaked with the process.
    unsafe { libc::_exit(i32::from(!written)) }
}
