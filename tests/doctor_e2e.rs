//! `nvhook doctor` on a simulated GPU node (run as root, after `cargo build --workspace`): a
//! node set up as an operator would (NVML's answer cached, /dev/char links, a CDI spec in its
//! /etc/cdi, Docker configured, a runc with every known escape fix on PATH) is ready; then each
//! check is broken on its own, and the line that names it and the exit status say so. The
//! host's own runtimes are named with the versions they print.

use nvhook_test_support as support;
use serde_json::Value;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::{SimNode, nvhook_bin, output_of_copied_binary, run_nvhook, workspace_bin};

/// A node ready for GPU containers: 2 GPUs, GPU 1 split into 2 MIG devices; the engine
/// configs and CDI specs in a host root of their own, which survives changes to the node;
/// doctor's PATH a directory of its own, holding a runc that lacks no known fix.
struct Node {
    sim: SimNode,
    host: tempfile::TempDir,
    bin: tempfile::TempDir,
}

/// `runc --version` of runc 1.3.6, and of Debian 12's runc (where they come from:
/// src/doctor/runtimes.rs, `recorded`).
const RUNC_1_3_6: &str = include_str!("golden/runtimes/runc-1.3.6.txt");
const RUNC_DEBIAN_12: &str = include_str!("golden/runtimes/runc-1.1.5-debian-12.txt");

/// A program in `dir` that prints `output` for `--version`, as a runtime would.
fn fake_runtime(dir: &Path, name: &str, output: &str) -> PathBuf {
    let path = dir.join(name);
    let lines: String = output.lines().map(|l| format!(" '{l}'")).collect();
    // printf is the shell's own: doctor runs the runtime with no PATH.
    fs::write(&path, format!("#!/bin/sh\nprintf '%s\\n'{lines}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

const NVIDIA_NAMES: [&str; 3] = [
    "nvidia-container-runtime-hook",
    "nvidia-container-cli",
    "nvidia-cdi-hook",
];

/// Whether a line is about a dockerd this machine runs: doctor names every running one, and
/// this test starts none, so they are not the node's.
fn about_a_running_dockerd(line: &str) -> bool {
    line.split_whitespace().nth(1) == Some("dockerd")
}

/// `nvhook configure ENGINE --engine-config FILE` with the workspace's nvhook-runtime, which
/// must succeed.
fn configure_runtime(engine: &str, file: &Path) {
    let runtime = workspace_bin("nvhook-runtime");
    let out = run_nvhook(&[
        "configure",
        engine,
        "--engine-config",
        file.to_str().unwrap(),
        "--runtime-path",
        runtime.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
}

const FLAGS: [&str; 4] = ["--gpus", "2", "--mig", "1:2"];

impl Node {
    fn ready() -> Node {
        Self::ready_with(&[])
    }

    fn ready_with(extra: &[&str]) -> Node {
        let mut flags = vec!["--mig", "1:2"];
        flags.extend_from_slice(extra);
        let node = Node {
            sim: SimNode::create_with(2, &flags),
            host: tempfile::Builder::new()
                .prefix("nvhook-doctor-")
                .tempdir()
                .unwrap(),
            bin: tempfile::Builder::new()
                .prefix("nvhook-doctor-bin-")
                .tempdir()
                .unwrap(),
        };
        fake_runtime(node.bin.path(), "runc", RUNC_1_3_6);
        // NVIDIA's names for docker's and ctr's --gpus, as the packages link them.
        for name in NVIDIA_NAMES {
            std::os::unix::fs::symlink(nvhook_bin(), node.bin.path().join(name)).unwrap();
        }
        node.nvhook(&["dev-char-links"]);
        let spec = node.host("etc/cdi/nvidia.yaml");
        fs::create_dir_all(spec.parent().unwrap()).unwrap();
        // `cdi refresh` also stores NVML's answer.
        node.nvhook(&["cdi", "refresh", "--output", spec.to_str().unwrap()]);
        let daemon_json = node.host("etc/docker/daemon.json");
        fs::create_dir_all(daemon_json.parent().unwrap()).unwrap();
        fs::write(&daemon_json, "{}\n").unwrap();
        configure_runtime("docker", &daemon_json);
        node
    }

    /// A path in the simulated node (driver, dev, proc, NVML cache).
    fn path(&self, rel: &str) -> PathBuf {
        self.sim.root().join(rel)
    }

    /// A path in the host root doctor reads engine configs, hooks.d and CDI specs under.
    fn host(&self, rel: &str) -> PathBuf {
        self.host.path().join(rel)
    }

    fn nvhook(&self, args: &[&str]) -> String {
        let config = self.sim.config();
        let mut all = vec!["--config", config.to_str().unwrap()];
        all.extend_from_slice(args);
        let out = run_nvhook(&all);
        assert!(
            out.status.success(),
            "{args:?}: {out:?}\n{}",
            self.sim.log()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// doctor with `args`, runtimes looked for on `path`.
    fn run_doctor(&self, path: &OsStr, args: &[&str]) -> Output {
        let config = self.sim.config();
        let root = self.host.path();
        Command::new(nvhook_bin())
            .args(["--config", config.to_str().unwrap(), "doctor"])
            .args(["--root", root.to_str().unwrap()])
            .args(args)
            .env_remove("NVHOOK_CONFIG")
            .env("PATH", path)
            .output()
            .expect("run nvhook doctor")
    }

    /// doctor's exit status and its lines.
    fn doctor(&self) -> (i32, String) {
        self.doctor_on(self.bin.path().as_os_str())
    }

    /// doctor's exit status and its lines, runtimes looked for on `path`.
    fn doctor_on(&self, path: &OsStr) -> (i32, String) {
        let out = self.run_doctor(path, &[]);
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap(), text)
    }

    /// Asserts doctor's exit status and that it has a line starting with `start` (level and
    /// check name) and containing each of `words`.
    fn expect(&self, code: i32, start: &str, words: &[&str]) {
        self.expect_on(self.bin.path().as_os_str(), code, start, words);
    }

    /// [`Node::expect`], runtimes looked for on `path`.
    fn expect_on(&self, path: &OsStr, code: i32, start: &str, words: &[&str]) {
        let (got, text) = self.doctor_on(path);
        assert_eq!(got, code, "{text}");
        let line = text
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line {start:?} in:\n{text}"));
        for word in words {
            assert!(line.contains(word), "{word:?} not in {line:?}");
        }
        assert!(
            line.contains("-> fix: ") || start.starts_with("ok"),
            "{line}"
        );
    }

    fn replace_node(&self, rel: &str, major: u32, minor: u32) {
        let path = self.path(rel);
        fs::remove_file(&path).unwrap();
        let dev = libc::makedev(major, minor);
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid path and mode; the test runs as root.
        let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, dev) };
        assert_eq!(made, 0);
    }
}

fn driver_lib(node: &Node, stem: &str) -> PathBuf {
    let version = node.sim.driver_version();
    node.sim
        .driver_root()
        .join(format!("usr/lib/x86_64-linux-gnu/{stem}.so.{version}"))
}

#[test]
fn a_node_set_up_as_documented_is_ready() {
    let node = Node::ready();
    let (code, text) = node.doctor();
    assert_eq!(code, 0, "{text}");
    let dockerd_warnings = text
        .lines()
        .filter(|l| about_a_running_dockerd(l) && l.starts_with("warn"))
        .count();
    for line in text
        .lines()
        .filter(|l| !l.starts_with("ready") && !about_a_running_dockerd(l))
    {
        assert!(line.starts_with("ok "), "{line}\n{text}");
    }
    for start in [
        "ok   kernel module: nvidia loaded, driver 550.54.15",
        "ok   nvhook binaries: ",
        "ok   NVML: answered in ",
        "ok   persistence mode GPU 1: on",
        "ok   device /dev/nvidia1: 195:1",
        "ok   device /dev/nvidia-uvm: ",
        "ok   device /dev/nvidia-uvm-tools: ",
        "ok   driver versions: libraries and kernel module are both 550.54.15",
        "ok   /dev/char links",
        "ok   NVML cache",
        "ok   driver files",
        "ok   engine docker",
        "ok   CDI ",
        "ok   runtime runc: runc 1.3.6 at ",
        "ok   name nvidia-container-runtime-hook: ",
        "ok   name nvidia-container-cli: ",
        "ok   name nvidia-cdi-hook: ",
        "ok   cgroup",
        "ok   policy: ",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(start)),
            "{start:?}:\n{text}"
        );
    }
    assert_eq!(
        text.lines().last(),
        Some(format!("ready (warn: {dockerd_warnings})").as_str())
    );

    let out = node.run_doctor(node.bin.path().as_os_str(), &["--format", "json"]);
    assert!(out.status.success());
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ready"], true);
    let checks = json["checks"].as_array().unwrap();
    assert_eq!(checks.len(), text.lines().count() - 1);
    assert!(
        checks
            .iter()
            .filter(|c| !c["name"].as_str().unwrap().starts_with("dockerd "))
            .all(|c| c["level"] == "ok" && c.get("fix").is_none())
    );
}

#[test]
fn a_missing_or_misnumbered_device_node_fails() {
    let node = Node::ready();
    fs::remove_file(node.path("dev/nvidia1")).unwrap();
    node.expect(
        1,
        "FAIL device /dev/nvidia1: missing (want 195:1)",
        &["nvidia-modprobe"],
    );
    node.replace_node("dev/nvidia0", 195, 7);
    node.expect(
        1,
        "FAIL device /dev/nvidia0: is 195:7, want 195:0",
        &["mknod"],
    );
}

#[test]
fn no_nvidia_uvm_fails() {
    let node = Node::ready();
    fs::remove_file(node.path("dev/nvidia-uvm")).unwrap();
    node.expect(1, "FAIL device /dev/nvidia-uvm: missing", &["nvidia-uvm"]);
}

/// Two causes of cuInit's CUDA_ERROR_UNKNOWN while nvidia-smi works: nvidia-uvm-tools' node
/// missing, and a kernel module of another release than the libraries (a driver upgraded
/// without a reboot).
#[test]
fn the_causes_of_cuinit_unknown_fail() {
    let node = Node::ready();
    fs::remove_file(node.path("dev/nvidia-uvm-tools")).unwrap();
    node.expect(
        1,
        "FAIL device /dev/nvidia-uvm-tools: missing (want ",
        &["nvidia-modprobe -u"],
    );
    let node = Node::ready();
    let version = node.path("proc/driver/nvidia/version");
    let text = fs::read_to_string(&version).unwrap();
    fs::write(&version, text.replace("550.54.15", "550.90.07")).unwrap();
    node.expect(
        1,
        "FAIL driver versions: the kernel module loaded is 550.90.07, but libcuda.so.550.54.15 is 550.54.15, libnvidia-ml.so.550.54.15 is 550.54.15: cuInit fails",
        &["reboot", "modprobe nvidia nvidia-uvm"],
    );
}

#[test]
fn no_kernel_module_fails() {
    let node = Node::ready();
    fs::remove_file(node.path("proc/driver/nvidia/version")).unwrap();
    node.expect(
        1,
        "FAIL kernel module: ",
        &["not loaded", "modprobe nvidia"],
    );
}

#[test]
fn nvml_that_cannot_initialise_fails() {
    let node = Node::ready();
    let mut flags = FLAGS.to_vec();
    flags.extend(["--nvml-init-error", "9"]);
    node.sim.change(&flags);
    node.expect(
        1,
        "FAIL NVML: nvhook-nvml could not ask NVML",
        &["driver is not loaded"],
    );
}

#[test]
fn persistence_mode_off_warns() {
    let node = Node::ready_with(&["--persistence-off", "1"]);
    node.expect(
        0,
        "warn persistence mode GPU 1: off",
        &["nvidia-smi -i 1 -pm 1"],
    );
}

#[test]
fn a_stale_or_missing_nvml_cache_warns() {
    let node = Node::ready();
    let cache = node.path("run/nvml-inventory.json");
    let mut stored: Value = serde_json::from_slice(&fs::read(&cache).unwrap()).unwrap();
    stored["fingerprint"]["boot_id"] = "an-earlier-boot".into();
    fs::write(&cache, stored.to_string()).unwrap();
    node.expect(0, "warn NVML cache: ", &["stored for another host state"]);
    fs::remove_file(&cache).unwrap();
    node.expect(0, "warn NVML cache: ", &["none stored yet"]);
}

#[test]
fn a_missing_or_damaged_driver_library_fails() {
    let node = Node::ready();
    fs::remove_file(driver_lib(&node, "libcuda")).unwrap();
    node.expect(1, "FAIL driver libcuda.so.1: ", &["ldconfig"]);

    let node = Node::ready();
    let lib = driver_lib(&node, "libnvidia-ptxjitcompiler");
    fs::write(&lib, "not a library\n").unwrap();
    node.expect(
        1,
        "FAIL driver files: ",
        &[lib.to_str().unwrap(), "not an ELF file", "reinstall"],
    );
}

#[test]
fn an_unreadable_library_fails() {
    let node = Node::ready();
    let lib = driver_lib(&node, "libnvidia-ptxjitcompiler");
    // Root reads a file whatever its mode: a directory in its place cannot be read.
    fs::remove_file(&lib).unwrap();
    fs::create_dir(&lib).unwrap();
    node.expect(1, "FAIL driver files: ", &[lib.to_str().unwrap()]);
}

/// The first bytes of a 64-bit ELF file for another architecture than this machine's (the
/// tests' build target): aarch64 (EM_AARCH64 183) on x86_64, x86_64 (62) elsewhere.
fn foreign_elf() -> (Vec<u8>, &'static str) {
    let (machine, name) = match std::env::consts::ARCH {
        "x86_64" => (183u16, "aarch64"),
        _ => (62, "x86_64"),
    };
    let mut head = vec![0u8; 64];
    head[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    head[16] = 3;
    head[18..20].copy_from_slice(&machine.to_le_bytes());
    (head, name)
}

#[test]
fn a_driver_library_of_another_architecture_fails() {
    let node = Node::ready();
    let lib = driver_lib(&node, "libnvidia-ptxjitcompiler");
    let (head, foreign) = foreign_elf();
    fs::write(&lib, head).unwrap();
    let arch = std::env::consts::ARCH;
    node.expect(
        1,
        "FAIL driver files: ",
        &[
            lib.to_str().unwrap(),
            &format!("built for {foreign} on this {arch} node"),
            &format!("install the NVIDIA driver for {arch}"),
        ],
    );
}

/// An nvhook-nvml of another architecture beside nvhook (a package of the wrong architecture,
/// copied by hand): doctor names it before NVML's failure, which it explains.
#[test]
fn an_nvhook_binary_of_another_architecture_fails() {
    let node = Node::ready();
    let alone = tempfile::Builder::new()
        .prefix("nvhook-doctor-arch-")
        .tempdir()
        .unwrap();
    let nvhook = alone.path().join("nvhook");
    fs::copy(nvhook_bin(), &nvhook).unwrap();
    let helper = alone.path().join("nvhook-nvml");
    let (head, foreign) = foreign_elf();
    fs::write(&helper, head).unwrap();
    fs::set_permissions(&helper, fs::Permissions::from_mode(0o755)).unwrap();
    let config = node.sim.config();
    let out = output_of_copied_binary(
        Command::new(&nvhook)
            .args(["--config", config.to_str().unwrap(), "doctor"])
            .args(["--root", node.host.path().to_str().unwrap()])
            .env_remove("NVHOOK_CONFIG")
            .env("PATH", node.bin.path()),
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("FAIL nvhook binaries: "))
        .unwrap_or_else(|| panic!("no nvhook binaries line:\n{text}"));
    let arch = std::env::consts::ARCH;
    assert!(
        line.contains(&format!(
            "{}: built for {foreign} (this node runs {arch})",
            helper.display()
        )),
        "{line}"
    );
    assert!(line.contains("-> fix: install nvhook's "), "{line}");
    // nvhook itself, of this machine's architecture, is not named.
    assert!(!line.contains(&format!("{}:", nvhook.display())), "{line}");
    assert!(text.lines().any(|l| l.starts_with("FAIL NVML")), "{text}");
}

#[test]
fn an_engine_config_without_nvhook_fails() {
    let node = Node::ready();
    fs::write(node.host("etc/docker/daemon.json"), "{\"runtimes\": {}}\n").unwrap();
    node.expect(
        1,
        "FAIL engine docker: ",
        &["no runtime nvidia", "nvhook configure docker"],
    );
    fs::write(node.host("etc/docker/daemon.json"), "{ not json").unwrap();
    node.expect(1, "FAIL engine docker: ", &["daemon.json"]);
}

/// Every `nvhook configure ...` a fix in `report` proposes, run with `--dry-run`: configure
/// must take each (a fix that configure itself refuses is no fix). Returns how many there were.
fn assert_configure_takes_every_proposal(report: &str) -> usize {
    let mut proposals = 0;
    for line in report.lines() {
        let Some((_, fix)) = line.split_once(" -> fix: ") else {
            continue;
        };
        for (_, rest) in fix
            .match_indices("nvhook configure ")
            .map(|(at, _)| ((), &fix[at..]))
        {
            let command = rest.split(", then").next().unwrap();
            let words: Vec<&str> = command.split_whitespace().skip(1).collect();
            // A placeholder (ENGINE, FILE) is not a command to run.
            if words
                .iter()
                .any(|w| w.len() > 1 && w.chars().all(|c| c.is_ascii_uppercase()))
            {
                continue;
            }
            let out = run_nvhook(&[&words[..], &["--dry-run"]].concat());
            assert!(
                out.status.success(),
                "doctor proposed {command:?}, which configure refuses: {}\n{report}",
                String::from_utf8_lossy(&out.stderr)
            );
            proposals += 1;
        }
    }
    proposals
}

/// Issue 36: a `--runtime-path` that is not there is a FAIL naming it, and no engine line
/// proposes the `nvhook configure` command configure would refuse for it; with the runtime
/// there, the proposed command is one configure takes.
#[test]
fn a_missing_runtime_fails_and_no_fix_proposes_what_configure_refuses() {
    let node = Node::ready();
    let main = node.host("etc/containerd/config.toml");
    fs::create_dir_all(main.parent().unwrap()).unwrap();
    fs::write(&main, "version = 2\n").unwrap();
    let runtime = workspace_bin("nvhook-runtime");
    let (main, runtime) = (main.display(), runtime.display());

    let (code, text) = node.doctor();
    assert_eq!(code, 1, "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("FAIL engine containerd: "))
        .unwrap_or_else(|| panic!("no engine containerd line:\n{text}"));
    assert_eq!(
        line,
        format!(
            "FAIL engine containerd: {main}: no runtime nvidia running {runtime} -> fix: nvhook configure containerd --engine-config {main} --runtime-path {runtime}, then restart it"
        )
    );
    assert!(!text.contains("FAIL nvhook-runtime"), "{text}");
    assert_eq!(assert_configure_takes_every_proposal(&text), 1, "{text}");

    let scratch = tempfile::tempdir().unwrap();
    let missing = scratch.path().join("absent/nvhook-runtime");
    let missing = missing.to_str().unwrap();
    let out = node.run_doctor(node.bin.path().as_os_str(), &["--runtime-path", missing]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    let runtime_line = format!(
        "FAIL nvhook-runtime: {missing} does not exist: an engine told to run it fails every container it starts with it -> fix: install nvhook's package (it puts nvhook-runtime beside nvhook, {runtime}), or name the installed one with --runtime-path"
    );
    assert!(lines.contains(&runtime_line.as_str()), "{text}");
    let instead = format!(
        "install nvhook-runtime, or name the installed one with --runtime-path (configure refuses {missing}, which is not there; see the nvhook-runtime line), then run nvhook doctor again for the configure command"
    );
    let daemon_json = node.host("etc/docker/daemon.json");
    for (engine, file) in [
        ("containerd", main.to_string()),
        ("docker", daemon_json.display().to_string()),
    ] {
        let line = format!(
            "FAIL engine {engine}: {file}: no runtime nvidia running {missing} -> fix: {instead}"
        );
        assert!(lines.contains(&line.as_str()), "{line}\nnot in:\n{text}");
    }
    assert_eq!(assert_configure_takes_every_proposal(&text), 0, "{text}");
    // What configure says to the command doctor no longer proposes.
    let out = run_nvhook(&[
        "configure",
        "containerd",
        "--engine-config",
        &main.to_string(),
        "--runtime-path",
        missing,
        "--dry-run",
    ]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn a_cdi_spec_naming_a_gpu_that_is_gone_fails() {
    let node = Node::ready();
    // GPU 1 (with its MIG devices) falls off the bus.
    node.sim.change(&["--gpus", "2", "--lost-gpu", "1"]);
    // The fix names the config doctor was given.
    let fix = format!(
        "nvhook --config {} cdi refresh",
        node.sim.config().display()
    );
    node.expect(
        1,
        "FAIL CDI ",
        &[
            "stale",
            "names devices this node does not have: 1, 1:0, 1:1",
            &fix,
        ],
    );
}

#[test]
fn a_cdi_spec_whose_argument_file_is_gone_fails() {
    let node = Node::ready();
    let beside: Vec<PathBuf> = fs::read_dir(node.host("etc/cdi"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".args"))
        .collect();
    assert_eq!(beside.len(), 1, "{beside:?}");
    fs::remove_file(&beside[0]).unwrap();
    let fix = format!(
        "nvhook --config {} cdi refresh",
        node.sim.config().display()
    );
    node.expect(
        1,
        "FAIL CDI ",
        &["stale", "cannot use its argument file", &fix],
    );
}

#[test]
fn a_malformed_cdi_spec_fails() {
    let node = Node::ready();
    fs::write(node.host("etc/cdi/broken.yaml"), "kind: [").unwrap();
    node.expect(1, "FAIL CDI ", &["broken.yaml"]);
}

#[test]
fn a_missing_dev_char_link_warns() {
    let node = Node::ready();
    fs::remove_file(node.path("dev/char/195:1")).unwrap();
    let fix = format!(
        "nvhook --config {} dev-char-links",
        node.sim.config().display()
    );
    node.expect(0, "warn /dev/char links: missing or wrong: 195:1", &[&fix]);
}

#[test]
fn nvidia_names_missing_or_leading_elsewhere_warn() {
    let node = Node::ready();
    fs::remove_file(node.bin.path().join("nvidia-container-runtime-hook")).unwrap();
    node.expect(
        0,
        "warn name nvidia-container-runtime-hook: not on PATH",
        &["ln -s ", "/usr/bin/nvidia-container-runtime-hook"],
    );
    // NVIDIA's own program of that name, as libnvidia-container-tools installs it.
    let cli = node.bin.path().join("nvidia-container-cli");
    fs::remove_file(&cli).unwrap();
    fake_runtime(node.bin.path(), "nvidia-container-cli", "NVIDIA's");
    node.expect(
        0,
        "warn name nvidia-container-cli: ",
        &["not this nvhook", "libnvidia-container-tools"],
    );
}

#[test]
fn podman_without_the_hook_file_warns() {
    let node = Node::ready();
    let podman = node.host("usr/bin/podman");
    fs::create_dir_all(podman.parent().unwrap()).unwrap();
    fs::write(&podman, "").unwrap();
    node.expect(0, "warn podman hooks.d: ", &["oci-nvhook-hook.json"]);
    let hooks_d = node.host("usr/share/containers/oci/hooks.d");
    fs::create_dir_all(&hooks_d).unwrap();
    let hook = Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks/oci-nvhook-hook.json");
    fs::copy(hook, hooks_d.join("oci-nvhook-hook.json")).unwrap();
    node.expect(0, "ok   podman hooks.d: ", &["runs nvhook"]);
}

/// The engines' own configs, judged by what `nvhook configure` reads and writes: containerd
/// 2.3's default (version 4, nvhook's runtime in the drop-in it imports) and a k3s template.
#[test]
fn containerd_2_and_k3s_configs_are_read_as_configure_reads_them() {
    let node = Node::ready();
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/configure");
    let main = node.host("etc/containerd/config.toml");
    fs::create_dir_all(main.parent().unwrap()).unwrap();
    // Imports named relative to the main file: the host's own conf.d stays untouched.
    let text = fs::read_to_string(golden.join("containerd-2.3-default.toml"))
        .unwrap()
        .replace("/etc/containerd/conf.d/*.toml", "conf.d/*.toml");
    fs::write(&main, text).unwrap();
    let template = node.host("var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl");
    fs::create_dir_all(template.parent().unwrap()).unwrap();
    fs::copy(golden.join("k3s-config.toml.tmpl"), &template).unwrap();
    node.expect(1, "FAIL engine containerd: ", &["no runtime nvidia"]);
    node.expect(1, "FAIL engine k3s: ", &["nvhook configure k3s"]);

    for (engine, file) in [("containerd", &main), ("k3s", &template)] {
        configure_runtime(engine, file);
    }
    node.expect(0, "ok   engine containerd: ", &["runtime nvidia is"]);
    node.expect(0, "ok   engine k3s: ", &["runtime nvidia is"]);

    fs::remove_file(node.host("etc/containerd/conf.d/99-nvhook.toml")).unwrap();
    node.expect(1, "FAIL engine containerd: ", &["no runtime nvidia"]);
}

/// What the host's own runc and crun print, doctor names: `runc --version` says 1.1.5+ds1 on
/// Debian 12, and doctor's line says runc 1.1.5, built as 1.1.5+ds1.
#[test]
fn the_hosts_runtimes_are_named_with_the_versions_they_print() {
    let node = Node::ready();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let (code, text) = node.doctor_on(&path);
    assert_eq!(code, 0, "{text}");
    let runc = support::require_program("runc");
    let crun = std::env::split_paths(&path)
        .map(|d| d.join("crun"))
        .find(|c| c.is_file());
    for program in std::iter::once(runc).chain(crun) {
        let name = program.file_name().unwrap().to_str().unwrap().to_string();
        let printed = support::stdout_of(Command::new(&program).arg("--version"));
        let word = printed
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(2))
            .unwrap_or_else(|| panic!("{printed}"));
        let upstream: String = word
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let line = text
            .lines()
            .find(|l| l.contains(&format!(" runtime {name}: ")))
            .unwrap_or_else(|| panic!("no {name} line in:\n{text}"));
        assert!(
            line.starts_with(&format!("ok   runtime {name}: {name} {upstream}"))
                || line.starts_with(&format!("warn runtime {name}: {name} {upstream}")),
            "{line}"
        );
        assert!(line.contains(word), "{word:?} not in {line}");
    }
}

/// Debian 12's runc: a warning naming each fix it lacks and the release that has them all,
/// and saying that a distribution's build may carry them; warnings leave the node ready.
#[test]
fn a_runtime_without_escape_fixes_warns() {
    let node = Node::ready();
    fake_runtime(node.bin.path(), "runc", RUNC_DEBIAN_12);
    node.expect(
        0,
        "warn runtime runc: runc 1.1.5 at ",
        &[
            "which nvhook-runtime execs",
            "built as 1.1.5+ds1, commit 1.1.5+ds1-1+deb12u1",
            "CVE-2024-21626 (fixed in 1.1.12)",
            "CVE-2026-41579 (fixed in 1.3.6, 1.4.3, 1.5.0-rc.3)",
            "a distribution's build may have them",
            "-> fix: upgrade runc to 1.3.6 or later",
        ],
    );
}

/// A runtime named by absolute path in the config is found off PATH; with none anywhere,
/// doctor says so.
#[test]
fn runtimes_are_looked_for_as_nvhook_runtime_looks() {
    let node = Node::ready();
    let elsewhere = tempfile::tempdir().unwrap();
    let crun = fake_runtime(
        elsewhere.path(),
        "crun",
        "crun version 1.28\ncommit: 0000000\n",
    );
    let empty = tempfile::tempdir().unwrap();
    node.sim.configure(&format!(
        "runtimes = [\"runc\", {:?}]",
        crun.to_str().unwrap()
    ));
    let (code, text) = node.doctor_on(empty.path().as_os_str());
    assert_eq!(code, 0, "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("ok   runtime crun: "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains(&format!(
            "crun 1.28 at {}, which nvhook-runtime execs",
            crun.display()
        )),
        "{line}"
    );

    fs::remove_file(&crun).unwrap();
    node.expect_on(
        empty.path().as_os_str(),
        0,
        "warn runtimes: none of runc, ",
        &[crun.to_str().unwrap(), "nvhook-runtime has nothing to exec"],
    );
}

/// NRI plugin mode: nvhook pre-registered in the plugin directory of a containerd 1.7 whose
/// NRI is off fails with `configure --nri`'s fix, and needs no runtime; NRI on is ok; a socket
/// file nobody listens on fails; a plugin connected to something that is no engine fails,
/// named by its pid; one registered with a real engine (sid's containerd 2.1.9, its NRI socket
/// where doctor looks) is ok, and the same plugin started for another socket fails; the
/// runtime registered beside it is double work, and the line says which wins.
#[test]
fn nri_mode_is_checked_engine_socket_plugin_and_double_work() {
    let node = Node::ready();
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/configure");
    let main = node.host("etc/containerd/config.toml");
    fs::create_dir_all(main.parent().unwrap()).unwrap();
    fs::copy(golden.join("containerd-1.7-default.toml"), &main).unwrap();
    node.expect(1, "FAIL engine containerd: ", &["no runtime nvidia"]);
    let (_, text) = node.doctor();
    assert!(
        !text.contains(" NRI "),
        "no NRI lines outside NRI mode:\n{text}"
    );
    // `--nri`, as the Kubernetes installer's NRI mode runs doctor: NRI lines, no runtime needed.
    let out = node.run_doctor(node.bin.path().as_os_str(), &["--nri"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("\nFAIL NRI containerd: off in "), "{text}");
    assert!(text.contains("GPUs come through NRI"), "{text}");

    // The link as an operator makes it, to the host's nvhook.
    let nvhook = node.host("usr/bin/nvhook");
    fs::create_dir_all(nvhook.parent().unwrap()).unwrap();
    fs::copy(nvhook_bin(), &nvhook).unwrap();
    let plugins = node.host("opt/nri/plugins");
    fs::create_dir_all(&plugins).unwrap();
    std::os::unix::fs::symlink("/usr/bin/nvhook", plugins.join("10-nvhook")).unwrap();
    node.expect(1, "ok   engine containerd: ", &["GPUs come through NRI"]);
    node.expect(
        1,
        "FAIL NRI containerd: ",
        &["off in ", "nvhook configure containerd --nri", "once"],
    );
    node.expect(1, "warn NRI socket: ", &["/var/run/nri/nri.sock"]);
    // Set up; running or not depends on what else this machine runs: the line names the link.
    let (_, text) = node.doctor();
    let plugin = text.lines().find(|l| l.contains(" NRI plugin: ")).unwrap();
    assert!(
        plugin.contains("10-nvhook (started by the engine at its start)"),
        "{plugin}"
    );

    // configure asks containerd whether it has NRI: a 1.7, as this config is 1.7's.
    let containerd_17 = tempfile::tempdir().unwrap();
    support::containerd_1_7_in(containerd_17.path());
    let out = Command::new(nvhook_bin())
        .args(["configure", "containerd", "--nri", "--engine-config"])
        .arg(&main)
        .env_remove("NVHOOK_CONFIG")
        .env(
            "PATH",
            format!(
                "{}:/usr/sbin:/usr/bin:/sbin:/bin",
                containerd_17.path().display()
            ),
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    node.expect(0, "ok   NRI containerd: ", &["on in "]);

    // A socket file nobody listens on (an engine that stopped left it): not ok.
    let socket = node.host("var/run/nri/nri.sock");
    fs::create_dir_all(socket.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    node.expect(
        1,
        "FAIL NRI socket: ",
        &["nothing answers on it", "leftover"],
    );
    fs::remove_file(&socket).unwrap();

    // A socket that listens but is no engine: the plugin runs, connected, and is registered
    // with nothing; doctor says so, with its pid.
    let start_plugin = |socket: &Path| {
        Command::new(&nvhook)
            .args([
                "--config",
                node.sim.config().to_str().unwrap(),
                "nri",
                "--socket",
            ])
            .arg(socket)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let mut plugin = start_plugin(&socket);
    // Doctor looks once the plugin has connected: by then it has dropped any record an
    // earlier plugin with its pid left behind (pids are reused).
    listener.set_nonblocking(true).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let _connection = loop {
        match listener.accept() {
            Ok((connection, _)) => break connection,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the plugin did not connect to {}",
                    socket.display()
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("accept on {}: {e}", socket.display()),
        }
    };
    node.expect(
        1,
        "FAIL NRI plugin: ",
        &[
            &format!("running (pid {})", plugin.id()),
            "registered with no engine",
        ],
    );
    let _ = plugin.kill();
    let _ = plugin.wait();
    drop(listener);
    fs::remove_file(&socket).unwrap();

    // A real engine: Debian sid's containerd 2.1.9 with its NRI socket where doctor looks.
    let dir = support::engines::EngineDir::new("doctor-nri");
    let mut setup = support::containerd2::Containerd2Cri::under(dir.path());
    let elsewhere = setup.nri.socket.clone();
    setup.nri.socket = socket.clone();
    let containerd = setup.start(dir.path(), &[]);
    let mut plugin = start_plugin(&socket);
    // Doctor says ok once the plugin is registered (it takes the engine a moment).
    let wait_registered = |pid: u32| {
        let line = format!(
            "running (pid {pid}), registered with the engine at {}",
            socket.display()
        );
        let waited = std::time::Instant::now();
        loop {
            let (_, text) = node.doctor();
            if text
                .lines()
                .any(|l| l.starts_with("ok   NRI plugin: ") && l.contains(&line))
            {
                return;
            }
            assert!(
                waited.elapsed() < std::time::Duration::from_secs(20),
                "{text}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    wait_registered(plugin.id());
    node.expect(0, "ok   NRI socket: ", &["answers"]);
    // The same plugin, had it been started for another socket: registered there, not here.
    let mut other = start_plugin(&elsewhere);
    let _ = plugin.kill();
    let _ = plugin.wait();
    node.expect(
        1,
        "FAIL NRI plugin: ",
        &[&format!("running (pid {})", other.id())],
    );
    let _ = other.kill();
    let _ = other.wait();
    let mut plugin = start_plugin(&socket);
    wait_registered(plugin.id());

    // The runtime too: both work, NRI first.
    configure_runtime("containerd", &main);
    node.expect(
        0,
        "warn NRI and runtime: ",
        &[
            "NVIDIA_VISIBLE_DEVICES=void",
            "NRI wins",
            "nvhook configure containerd --remove",
        ],
    );
    let _ = plugin.kill();
    let _ = plugin.wait();
    containerd.stop_leaving_nothing(dir.path());
}

/// The real nvhook-dra, serving where doctor looks (the kubelet's directories under the host
/// root, as the DaemonSet's hostPath volumes make them); killed on drop.
struct DraPlugin {
    child: std::process::Child,
    socket: PathBuf,
}

impl DraPlugin {
    /// Started for `node`, and listening: the registration socket accepts a connection. No
    /// API server answers it: registering and serving need none (a claim would).
    fn start(node: &Node) -> DraPlugin {
        let registry = node.host("var/lib/kubelet/plugins_registry");
        let plugins = node.host("var/lib/kubelet/plugins");
        let cdi = node.host("var/run/cdi");
        for dir in [&registry, &plugins, &cdi] {
            fs::create_dir_all(dir).unwrap();
        }
        let child = Command::new(workspace_bin("nvhook-dra"))
            .args([
                "--node-name",
                "doctor-node",
                "--api-server",
                "http://127.0.0.1:9",
            ])
            .arg("--config")
            .arg(node.sim.config())
            .arg("--cdi-root")
            .arg(&cdi)
            .arg("--registry-dir")
            .arg(&registry)
            .arg("--plugins-dir")
            .arg(&plugins)
            .env_remove("NVHOOK_CONFIG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start nvhook-dra");
        let plugin = DraPlugin {
            child,
            socket: registry.join("gpu.nvidia.com-reg.sock"),
        };
        let started = std::time::Instant::now();
        while std::os::unix::net::UnixStream::connect(&plugin.socket).is_err() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "nvhook-dra does not listen on {}",
                plugin.socket.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        plugin
    }

    /// SIGKILL, as a plugin that crashes or is OOM-killed dies: its socket stays behind.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for DraPlugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nvhook's DRA kubelet plugin, judged by its registration socket under --root, where the
/// kubelet's plugin watcher finds it: none is "not installed" and the node stays ready (the
/// plugin is optional); the real nvhook-dra serving there is ok; the same plugin killed leaves
/// a socket that refuses connections, which fails with the restart as the fix; a new plugin
/// (the DaemonSet's next pod) takes the socket over, and the node is ready again.
#[test]
fn the_dra_plugin_is_optional_ok_while_serving_and_fails_once_dead() {
    let node = Node::ready();
    let socket = "/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock";
    node.expect(0, "ok   DRA plugin: ", &["not installed", socket]);

    let mut plugin = DraPlugin::start(&node);
    node.expect(
        0,
        "ok   DRA plugin: ",
        &["gpu.nvidia.com registered and serving", socket],
    );

    plugin.kill();
    assert!(plugin.socket.exists(), "a killed plugin leaves its socket");
    node.expect(
        1,
        "FAIL DRA plugin: ",
        &[
            socket,
            "refuses connections",
            "Connection refused",
            "restart the nvhook-dra pod",
        ],
    );

    let _next = DraPlugin::start(&node);
    node.expect(0, "ok   DRA plugin: ", &["registered and serving"]);
}
