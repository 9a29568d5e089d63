//! `scripts/gpu-node-check.sh`'s kit, made of this build instead of packed: the binaries
//! linked in, an image's rootfs copied, the script and runc's default spec beside them. Its
//! checks then run against a simulated node, whose roots the caller passes in
//! `NVHOOK_EXTRA_CONFIG`.

use crate::cmd::run_checked;
use crate::{Image, SimNode, nvhook_bin, require_program, workspace_bin};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Command, Output};

/// A kit in `kit` (an empty directory) whose image is a copy of `image`.
pub fn make(kit: &Path, image: &Image) {
    let bin = kit.join("bin");
    fs::create_dir(&bin).expect("create the kit's bin");
    for (name, path) in [
        ("nvhook", nvhook_bin().to_owned()),
        ("nvhook-nvml", workspace_bin("nvhook-nvml")),
        ("runc", require_program("runc")),
    ] {
        symlink(path, bin.join(name)).expect("link a binary into the kit");
    }
    image.instantiate(kit);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gpu-node-check.sh");
    copy(&script, &kit.join("gpu-node-check.sh"));
    run_checked(
        Command::new(require_program("runc"))
            .arg("spec")
            .current_dir(kit),
    );
    fs::rename(kit.join("config.json"), kit.join("spec.json")).expect("name runc's spec");
}

/// `cp -a from to`.
pub fn copy(from: &Path, to: &Path) {
    run_checked(Command::new("cp").arg("-a").arg(from).arg(to));
}

/// The lines of `node`'s config that place its driver, devices, /proc and /sys: what the
/// kit's configs need added to find the node.
pub fn node_roots(node: &SimNode) -> String {
    fs::read_to_string(node.config())
        .expect("read the node's config")
        .lines()
        .filter(|l| {
            ["driver-root", "dev-root", "proc-root", "sys-root"]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Runs the kit's `check` (`cdi`, `compat`, ...) into `out` against `node`, with `env` added.
pub fn run(kit: &Path, check: &str, out: &Path, node: &SimNode, env: &[(&str, &str)]) -> Output {
    Command::new(kit.join("gpu-node-check.sh"))
        .arg(check)
        .arg(out)
        .env("NVHOOK_EXTRA_CONFIG", node_roots(node))
        .envs(env.iter().copied())
        .output()
        .expect("run gpu-node-check.sh")
}

/// What a failed check's assertion shows: its stdout, stderr and the named logs under `out`.
pub fn report(run: &Output, out: &Path, logs: &[&str]) -> String {
    let mut text = format!(
        "{}\n--- stderr\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    for log in logs {
        let body = fs::read_to_string(out.join(log)).unwrap_or_default();
        text.push_str(&format!("\n--- {log}\n{body}"));
    }
    text
}
