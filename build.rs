//! Link options for the nvhook binary only (not nvhook-nvml, the tests or proc-macros).

use std::path::PathBuf;

fn main() {
    // Every GPU container start execs nvhook for the hook (and for the shim's create). Linked
    // statically (a static PIE, still loaded at a random address), it skips the dynamic
    // loader: -0.4 ms and 39 fewer page faults per hook on a test VM. It then cannot load
    // libnvidia-ml, so the dynamic nvhook-nvml beside it does (src/inventory/isolated.rs).
    //
    // rustc asks for std's libraries as shared ones (-Bdynamic -lc ...) and a per-binary
    // `crt-static` does not exist, so linker scripts with those libraries' names, found first,
    // name the static archives instead. libgcc_s (std's unwinder, only used for backtraces
    // under panic = "abort") becomes libgcc's static unwinder the same way.
    let dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut scripts = vec![("gcc_s".to_string(), "-lgcc_eh".to_string())];
    for lib in ["c", "m", "dl", "rt", "pthread", "util"] {
        scripts.push((lib.into(), format!("-l:lib{lib}.a")));
    }
    for (name, input) in scripts {
        std::fs::write(
            dir.join(format!("lib{name}.so")),
            format!("INPUT({input})\n"),
        )
        .expect("write to OUT_DIR");
    }
    println!("cargo:rustc-link-arg-bin=nvhook=-L{}", dir.display());
    println!("cargo:rustc-link-arg-bin=nvhook=-static-pie");
    println!("cargo:rerun-if-changed=build.rs");
}
