//! Link options for the two binaries only (not the tests, the mock NVML or proc-macros).

use std::path::PathBuf;

fn main() {
    // Every GPU container start execs nvhook for the hook (and for the shim's create), and
    // loading libgcc_s.so.1 (for std's unwinder, only used for backtraces under panic =
    // "abort") is ~15 % of such a process's CPU time on a test VM. A linker script named
    // libgcc_s.so, found first, puts libgcc's static unwinder (libgcc_eh.a) in its place.
    let dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(dir.join("libgcc_s.so"), "INPUT(-lgcc_eh)\n").expect("write to OUT_DIR");
    println!("cargo:rustc-link-arg-bin=nvhook=-L{}", dir.display());
    // nvhook-runtime brings its own entry point and relocates itself (src/bin/nvhook-runtime):
    // a static PIE, loaded at a random address, with no libc and no dynamic loader.
    for arg in ["-nostartfiles", "-nostdlib", "-static-pie"] {
        println!("cargo:rustc-link-arg-bin=nvhook-runtime={arg}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
