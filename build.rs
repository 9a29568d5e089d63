//! Link options for the nvhook binary only (not nvhook-nvml, the tests or proc-macros).

use std::path::PathBuf;

fn main() {
    // Every GPU container start execs nvhook for the hook (and for nvhook-runtime's create). Linked
    // statically (a static PIE, still loaded at a random address), it skips the dynamic
    // loader: -0.4 ms and 39 fewer page faults per hook on a test VM. It then cannot load
    // libnvidia-ml, so the dynamic nvhook-nvml beside it does (src/inventory/isolated.rs).
    //
    // rustc asks for std's libraries as shared ones (-Bdynamic -lc ...) and a per-binary
    // `crt-static` does not exist, so linker scripts with those libraries' names, found first,
    // name the static archives instead. libgcc_s (std's unwinder, only used for backtraces
    // under panic = "abort") becomes libgcc's static unwinder the same way.
    //
    // On aarch64, glibc's libc.a calls libgcc's outline atomics (`__aarch64_ldadd4_relax`, ...)
    // and its soft-float helpers for long double (`__letf2`, ...), which the gcc driver adds
    // to a static link but rustc's `-nodefaultlibs` leaves out: libc's script there is a group
    // with libgcc.a and libgcc_eh.a, searched until nothing new is pulled in (libgcc_eh calls
    // back into libc). x86_64's libc.a needs neither.
    let dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let mut scripts = vec![("gcc_s".to_string(), "INPUT(-lgcc_eh)".to_string())];
    for lib in ["c", "m", "dl", "rt", "pthread", "util"] {
        let script = match (lib, target_arch.as_str()) {
            ("c", "aarch64") => "GROUP(-l:libc.a -l:libgcc.a -l:libgcc_eh.a)".to_string(),
            _ => format!("INPUT(-l:lib{lib}.a)"),
        };
        scripts.push((lib.into(), script));
    }
    for (name, script) in scripts {
        std::fs::write(dir.join(format!("lib{name}.so")), format!("{script}\n"))
            .expect("write to OUT_DIR");
    }
    println!("cargo:rustc-link-arg-bin=nvhook=-L{}", dir.display());
    println!("cargo:rustc-link-arg-bin=nvhook=-static-pie");
    println!("cargo:rerun-if-changed=build.rs");
}
