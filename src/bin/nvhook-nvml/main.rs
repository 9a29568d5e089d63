//! `nvhook-nvml LIBRARY`: NVML's view of the GPUs, for nvhook, which runs it with no
//! environment and reads the answer (JSON) on its stdout.
//!
//! nvhook is a static program, which spares every container start the dynamic loader's work,
//! and a static program cannot load libnvidia-ml. This one is dynamic and does only that.

fn main() {
    let Some(library) = std::env::args_os().nth(1) else {
        eprintln!("usage: nvhook-nvml LIBRARY (nvhook runs it to ask NVML about the GPUs)");
        std::process::exit(2);
    };
    std::process::exit(nvhook::inventory::isolated::answer(library.as_ref()));
}
