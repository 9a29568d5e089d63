//! `nvhook-nvml LIBRARY`: NVML's view of the GPUs, for nvhook, which runs it with no
//! environment and reads the answer (JSON, [`nvhook_model::inventory::Reply`]) on its stdout.
//!
//! nvhook is a static program, which spares every container start the dynamic loader's work,
//! and a static program cannot load libnvidia-ml. This one is dynamic and does only that; it
//! is the only program of the project that links nvml-wrapper.

mod query;

use std::io::Write;
use std::path::Path;

fn main() {
    let Some(library) = std::env::args_os().nth(1) else {
        eprintln!("usage: nvhook-nvml LIBRARY (nvhook runs it to ask NVML about the GPUs)");
        std::process::exit(2);
    };
    answer(Path::new(&library))
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
