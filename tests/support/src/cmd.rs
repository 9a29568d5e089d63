//! Running host commands with failures that explain themselves.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Panics unless the test runs as root: runc, mknod and mounts all need it.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the end-to-end tests start real containers and must run as root (euid is {euid})"
    );
}

/// Finds `name` on PATH, panicking with an install hint when it is absent.
pub fn require_program(name: &str) -> PathBuf {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!("`{name}` is not on PATH; the end-to-end tests need it (Debian: apt-get install runc busybox-static gcc util-linux)")
        })
}

/// Writes the executable script `path` (a runtime's wrapper, say), mode 0755.
pub fn write_script(path: &Path, script: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, script).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("make {} executable: {e}", path.display()));
}

/// Runs `cmd` to completion and panics with its full output if it fails.
pub fn run_checked(cmd: &mut Command) -> Output {
    let output = cmd
        .output()
        .unwrap_or_else(|err| panic!("cannot spawn {cmd:?}: {err}"));
    assert!(
        output.status.success(),
        "{cmd:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    output
}

/// Runs `cmd` and returns its stdout as text, panicking if it fails.
pub fn stdout_of(cmd: &mut Command) -> String {
    String::from_utf8(run_checked(cmd).stdout).expect("command output is not UTF-8")
}

/// `readelf FLAG -W PATH`'s output (binutils).
pub fn readelf(flag: &str, path: &Path) -> String {
    let out = Command::new(require_program("readelf"))
        .args([flag, "-W"])
        .arg(path)
        .output()
        .expect("run readelf");
    assert!(out.status.success(), "readelf {flag} {path:?}: {out:?}");
    String::from_utf8(out.stdout).expect("readelf prints text")
}

/// `cmd.output()` for a program the test has just copied. Another test's child, forked while
/// the copy was still open for writing, holds that descriptor until it execs; an exec
/// meanwhile fails with ETXTBSY, so it is tried again for up to a second.
pub fn output_of_copied_binary(cmd: &mut Command) -> Output {
    for _ in 0..100 {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            run => return run.unwrap_or_else(|e| panic!("run {cmd:?}: {e}")),
        }
    }
    panic!("{cmd:?} stayed busy (ETXTBSY) for a second");
}

/// A `containerd` in `dir` that says it is containerd 1.7 (as `containerd --version` does),
/// for the commands that ask the one on PATH whether it has NRI.
pub fn containerd_1_7_in(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let program = dir.join("containerd");
    std::fs::write(
        &program,
        "#!/bin/sh\necho 'containerd containerd.io v1.7.24 88bf19b2105c8b17560993bee28a01ddc2f97182'\n",
    )
    .expect("write a containerd 1.7");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755))
        .expect("make it executable");
}

/// The entries of a loader cache a container printed in hex (`hexdump -v -e '/1 "%02x"'`), as
/// the host's `ldconfig -p -C` lists them, in the cache's order, without the header line.
pub fn ld_cache_entries_of_hex(hex: &str) -> Vec<String> {
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    let file = tempfile::NamedTempFile::new().expect("a cache file");
    std::fs::write(file.path(), bytes).expect("write the cache");
    stdout_of(
        Command::new(require_program("ldconfig"))
            .arg("-p")
            .arg("-C")
            .arg(file.path()),
    )
    .lines()
    .filter_map(|l| l.strip_prefix('\t'))
    .map(|l| l.trim().to_string())
    .collect()
}
