//! `nvhook-nvml LIBRARY`: NVML's view of the GPUs, for nvhook, which runs it with no
//! environment and reads the answer (JSON, [`nvhook_model::inventory::Reply`]) on its stdout.
//!
//! `nvhook-nvml LIBRARY create-mig GPU_UUID GI_PROFILE_ID PLACEMENT_START` and
//! `nvhook-nvml LIBRARY destroy-mig MIG_UUID` make and remove a MIG device, answering
//! [`nvhook_model::inventory::CreateMigReply`] and [`nvhook_model::inventory::DestroyMigReply`].
//!
//! `nvhook-nvml LIBRARY set-memory-limits CGROUP_DIR SOFT_BYTES HARD_BYTES GPU_UUID...` and
//! `nvhook-nvml LIBRARY get-memory-limits CGROUP_DIR GPU_UUID` set and read a cgroup's GPU memory
//! limits, answering [`nvhook_model::inventory::SetMemoryLimitsReply`] and
//! [`nvhook_model::inventory::GetMemoryLimitsReply`].
//!
//! nvhook is a static program, which spares every container start the dynamic loader's work,
//! and a static program cannot load libnvidia-ml. This one is dynamic and does only that; it
//! is the only program of the project that links nvml-wrapper.

mod action;
mod memory_limits;
mod mig;
mod query;

use nvhook_model::inventory::{
    CreateMigReply, DestroyMigReply, GetMemoryLimitsReply, NvmlActionFailure, SetMemoryLimitsReply,
};
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::Path;

const USAGE: &str = "usage: nvhook-nvml LIBRARY [create-mig GPU_UUID GI_PROFILE_ID PLACEMENT_START | destroy-mig MIG_UUID | set-memory-limits CGROUP_DIR SOFT_BYTES HARD_BYTES GPU_UUID... | get-memory-limits CGROUP_DIR GPU_UUID] (nvhook runs it to ask NVML about the GPUs, to make MIG devices and to limit GPU memory)";

fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let Some((library, action)) = args.split_first() else {
        usage()
    };
    let library = Path::new(library);
    let Some((name, rest)) = action.split_first() else {
        answer(library)
    };
    // Every argument but a cgroup directory is text.
    let texts: Vec<&str> = rest.iter().map(|a| text(a)).collect();
    match (text(name), texts.as_slice()) {
        ("create-mig", [gpu, profile, start]) => {
            let (profile, start) = (number(profile), number(start));
            let reply: CreateMigReply =
                with_nvml(library, |nvml| mig::create(nvml, gpu, profile, start));
            reply_and_exit(&reply, reply.is_ok())
        }
        ("destroy-mig", [mig_uuid]) => {
            let reply: DestroyMigReply = with_nvml(library, |nvml| mig::destroy(nvml, mig_uuid));
            reply_and_exit(&reply, reply.is_ok())
        }
        ("set-memory-limits", [_, soft, hard, gpus @ ..]) if !gpus.is_empty() => {
            let (soft, hard) = (number(soft), number(hard));
            let dir = Path::new(&rest[0]);
            let reply: SetMemoryLimitsReply = with_nvml(library, |nvml| {
                memory_limits::set(nvml, library, dir, soft, hard, gpus)
            });
            reply_and_exit(&reply, reply.is_ok())
        }
        ("get-memory-limits", [_, gpu]) => {
            let dir = Path::new(&rest[0]);
            let reply: GetMemoryLimitsReply =
                with_nvml(library, |nvml| memory_limits::get(nvml, library, dir, gpu));
            reply_and_exit(&reply, reply.is_ok())
        }
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!("{USAGE}");
    std::process::exit(2)
}

/// An argument as text; a cgroup directory need not be, and is read as the path it is.
fn text(arg: &OsStr) -> &str {
    arg.to_str().unwrap_or("")
}

fn number<T: std::str::FromStr>(arg: &str) -> T {
    arg.parse().unwrap_or_else(|_| usage())
}

/// `action` on NVML loaded from `library`; a library that cannot be loaded fails it.
fn with_nvml<T>(
    library: &Path,
    action: impl FnOnce(&nvml_wrapper::Nvml) -> Result<T, NvmlActionFailure>,
) -> Result<T, NvmlActionFailure> {
    let nvml = query::init(library).map_err(|e| NvmlActionFailure {
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
