//! The mock is installed as `libnvidia-ml.so.<version>` behind a `libnvidia-ml.so.1`
//! symlink, exactly like the real driver library, so it must carry the same SONAME:
//! tools that inspect the driver files (ldconfig, the hook's library discovery) key on it.
//!
//! It must also need no library the real one does not (libc, libm, libdl, libpthread and the
//! loader): a minimal image that loads it would otherwise fail on the simulated node only.
//! std asks for libgcc_s (its unwinder, which panic = "abort" leaves to backtraces); a linker
//! script of that name, found first, names libgcc's static unwinder instead, and libgcc itself:
//! on aarch64, std's atomics call libgcc's outline helpers (`__aarch64_swp8_acq_rel`, ...),
//! which only libgcc.a holds once libgcc_s is gone.

use std::path::PathBuf;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    let dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(dir.join("libgcc_s.so"), "INPUT(-lgcc_eh -lgcc)\n").expect("write to OUT_DIR");
    println!("cargo:rustc-cdylib-link-arg=-L{}", dir.display());
    println!("cargo:rerun-if-changed=build.rs");
}
