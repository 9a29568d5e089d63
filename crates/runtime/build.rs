//! nvhook-runtime brings its own entry point and relocates itself (src/bin/nvhook-runtime):
//! a static PIE, loaded at a random address, with no libc and no dynamic loader.

fn main() {
    for arg in ["-nostartfiles", "-nostdlib", "-static-pie"] {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
