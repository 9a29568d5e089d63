//! Link options for the two binaries only (not the tests, the mock NVML or proc-macros).

use std::path::PathBuf;

fn main() {
    // Every container start execs nvhook-runtime three times and the hook once, and loading
    // libgcc_s.so.1 (for std's unwinder, only used for backtraces under panic = "abort") is
    // ~15 % of such a process's CPU time on a test VM. A linker script named libgcc_s.so,
    // found first, puts libgcc's static unwinder (libgcc_eh.a) in its place.
    let dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(dir.join("libgcc_s.so"), "INPUT(-lgcc_eh)\n").expect("write to OUT_DIR");
    println!("cargo:rustc-link-arg-bins=-L{}", dir.display());
    println!("cargo:rerun-if-changed=build.rs");
}
