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

    // The code a container start runs is a few hundred functions scattered through ~4 MB of
    // text: each start faults in a 64 KB window of it per function far from the last, and walks
    // the page tables for each 4 KB page it runs (costly under a hypervisor). link/hot-text.txt
    // names those functions, found by sampling starts (scripts/hot-text.sh), and glibc's objects
    // they call; a linker script puts them together, ahead of the rest of the text.
    let hot = std::fs::read_to_string(HOT_TEXT).expect("link/hot-text.txt is in the source tree");
    let script = dir.join("hot-text.ld");
    std::fs::write(&script, hot_text_script(&hot)).expect("write to OUT_DIR");
    println!(
        "cargo:rustc-link-arg-bin=nvhook=-Wl,-T,{}",
        script.display()
    );
    println!("cargo:rerun-if-changed={HOT_TEXT}");
    println!("cargo:rerun-if-changed=build.rs");
}

const HOT_TEXT: &str = "link/hot-text.txt";

/// A linker script that adds an output section of the listed functions' sections (rustc gives
/// each function its own, `.text.<symbol>`, or `.text.unlikely.<symbol>` for a cold one) and
/// the listed glibc objects' text, placed before the default script's `.text`.
fn hot_text_script(list: &str) -> String {
    let mut script = String::from("SECTIONS\n{\n  .text.nvhook_hot :\n  {\n");
    for line in list.lines().map(str::trim) {
        if let Some(symbol) = line.strip_prefix("function ") {
            script += &format!("    *(.text.{symbol} .text.unlikely.{symbol})\n");
        } else if let Some(member) = line.strip_prefix("libc ") {
            script += &format!("    *libc.a:{member}(.text .text.*)\n");
        } else if !line.is_empty() && !line.starts_with('#') {
            panic!("{HOT_TEXT}: not a `function` or `libc` line: {line}");
        }
    }
    script + "  }\n}\nINSERT BEFORE .text;\n"
}
